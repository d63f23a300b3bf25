"""`specdec serve`: an OpenAI-compatible HTTP server with speculative decoding and its numbers.

    schema.py     the request bodies (OpenAI's, plus the `speculation` extension), strictly checked
    scheduler.py  one generation at a time on a worker thread; a bounded line of waiting requests
    metrics.py    Prometheus counters and histograms
    app.py        routes, errors in OpenAI's format, API keys, streaming by server-sent events
    command.py    `specdec serve` and `specdec load-test` arguments
    load_test.py  concurrent streaming clients against a running server, every answer checked
"""
