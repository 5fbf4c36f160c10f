"""Serving deliveries over HTTP: the Flask app, the WSGI and ASGI routes, the fallback answers."""
