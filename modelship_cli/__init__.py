"""`modelship`: the operator's command line, a client of the REST API (imports no app)."""
