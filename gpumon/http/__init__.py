"""The HTTP server that serves /metrics and /health from the store, with the web config's TLS, basic auth and limits."""
