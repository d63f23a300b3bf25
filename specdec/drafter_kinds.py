"""The drafter kinds `--drafter` takes, one list for the parser, the help of every command and the
error that names them (kept free of imports, so that `--help` stays instant)."""

DRAFTER_KINDS = ("none", "ngram[:N]", "draft:MODEL", "early:L", "suffix[:PATH]", "eagle[:PATH]", "eagle-tree[:PATH]",
                 "eagle3[:PATH]", "eagle3-chain[:PATH]", "medusa[:PATH]",
                 "auto[:A,B,...]")


def drafter_help(default: str = "ngram") -> str:
    return f"{' | '.join(DRAFTER_KINDS)} (default: {default})"


def kind_names() -> list[str]:
    return [kind.split(":")[0].split("[")[0] for kind in DRAFTER_KINDS]


def check_drafter_spec(spec: str) -> None:
    """Refuse an unknown drafter kind (in `auto:A,B` too) by name, before anything is loaded; a known
    kind's argument is checked where it is built."""
    import difflib

    from specdec.errors import ConfigError

    kind, _, arg = spec.strip().partition(":")
    parts = [a.strip().partition(":") for a in arg.split(",")] if kind == "auto" and arg else [(kind, "", arg)]
    for name, _, part_arg in parts:
        if name in kind_names():
            continue
        close = difflib.get_close_matches(name, kind_names(), n=1)
        hint = f"did you mean '{close[0]}{':' + part_arg if part_arg else ''}'? " if close else ""
        raise ConfigError(f"unknown drafter '{spec.strip()}'; {hint}choose one of: {', '.join(DRAFTER_KINDS)}")
