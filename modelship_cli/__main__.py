from modelship_cli.main import main

main()
