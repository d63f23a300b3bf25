"""The commands that have no room of their own; each module has `add_arguments(parser)` and `run(args,
console)`, as every room's `command.py` does (`cli.py` lists them all).

    generate.py  one prompt, streamed in colour; --compare times plain decoding beside it
    chat.py      a conversation, each turn reusing the last one's cache
    plan.py      the speed-up formulas from α, γ, c
    costs.py     this machine's cost model for a model and its drafters
    show.py      a run on the terminal: its tokens in colour, its summary and per-drafter breakdown
"""
