"""manage.py runserver on Daphne (ASGI: the WebSockets and streams work), for development.

Daphne is imported only here: as an installed app it would load Twisted into every Modelship
process. `serve` is what runs Modelship (uvicorn, with its limits: modelship_site/server.py).
"""

from __future__ import annotations

from daphne.management.commands.runserver import Command as DaphneRunserver


class Command(DaphneRunserver):  # type: ignore[misc]  # daphne ships no type hints
    pass
