"""The site's one scheduler: the process that owns the on-demand controller and the
max_concurrency places for every gateway process and host (ARCHITECTURE.md, "Where scheduling
state lives"). `owner.py` is that process's server, `client.py` each gateway's link to it,
`wire.py` what they say to each other."""
