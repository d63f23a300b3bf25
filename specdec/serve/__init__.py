"""`specdec serve`: an OpenAI-compatible HTTP server with speculative decoding and its numbers.

    schema.py     the request bodies (OpenAI's, plus the `speculation` extension), strictly checked
    scheduler.py  one generation at a time on a worker thread; a bounded line of waiting requests
    metrics.py    Prometheus counters and histograms
    service.py    the settings, the loaded models and their engines, a request's speculation plan
    guard.py      API keys, the body bound, the request counter (ASGI middleware)
    responses.py  errors in OpenAI's format, answers as JSON or streamed by server-sent events
    app.py        the routes and their checks; the uvicorn server with its graceful shutdown
    command.py    `specdec serve`: its arguments, loading, uvicorn
    addresses.py  which hosts are this machine (loopback)
"""
