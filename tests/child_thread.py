"""Imported by a fork server in a test: starts a thread that lives on (a server must then not fork
its children: they would fork beside it)."""

import threading

threading.Thread(target=threading.Event().wait, daemon=True).start()
