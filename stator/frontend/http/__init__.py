"""The HTTP server: the app and its routes table, connection limits, keys and rate limits,
request ids, several API processes on one port, drain, and the worker-admin routes."""
