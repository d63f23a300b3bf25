"""`specdec load-test`: a client of any OpenAI-compatible server, kept apart from the server it loads.

    command.py  the command's arguments, a run or a load curve, its summary
    client.py   concurrent streaming clients (a speculation setting, answer lengths, a duration,
                clients that go away), every answer checked
    plot.py     a load curve as a PNG and a table
"""
