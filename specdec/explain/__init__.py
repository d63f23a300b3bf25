"""`specdec explain`: one run, traced round by round, as a self-contained HTML page.

    summary.py  the measured figures next to the seed formulas, and a worked example with the run's numbers
    page.py     the HTML (inline CSS and JavaScript, the run as JSON in the page; no network)
    command.py  `specdec explain` arguments and the run
"""
