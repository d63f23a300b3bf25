"""`specdec chat`: a multi-turn conversation; each turn prefills only what it added (the prefix cache)."""

from __future__ import annotations

from specdec.commands.show import stream_run
from specdec.errors import SpecdecError
from specdec.options import add_model_args, generation_config, load_engine, prepare_costs
from specdec.terminal import plural


def add_arguments(chat) -> None:
    add_model_args(chat)
    chat.add_argument("--system", default=None, help="a system message (default: none)")


def run(args, console) -> int:
    from specdec.decode.prefix_cache import PrefixCache

    config = generation_config(args)
    engine = load_engine(args, console)
    engine.prefix_cache = PrefixCache()  # each turn prefills only what the conversation added since the last
    target = engine.target
    if not target.tokenizer.chat_template:
        raise SpecdecError(f"specdec chat needs a model with a chat template, and {args.model} has none; give one "
                           "with --chat-template (chatml, gemma, or a Jinja file), or for plain text use "
                           "`specdec generate --raw PROMPT`")
    prepare_costs(engine, config, console)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    console.print("[dim]chat: /reset starts over, /exit or Ctrl-D leaves, Ctrl-C stops an answer, /help lists these[/dim]")
    while True:
        try:
            line = console.input("[bold]you> [/bold]")
        except EOFError:
            console.print()
            return 0
        text = line.strip()
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            messages = list(system)
            console.print("[dim]conversation cleared[/dim]")
            continue
        if text in ("/help", "/?"):
            console.print("[dim]/reset starts over, /exit or Ctrl-D leaves, Ctrl-C stops an answer; anything else is "
                          "sent to the model[/dim]")
            continue
        if text.startswith("/") and " " not in text:
            console.print(f"[dim]unknown command {text}; /help lists them (nothing was sent)[/dim]")
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        prompt_ids = target.tokenizer.apply_chat_template(messages)
        reply, _, stats = stream_run(engine, prompt_ids, config, console, stoppable=True)
        if stats is None:
            console.print("[dim]stopped: the conversation keeps what was written (Ctrl-C at the prompt or /exit "
                          "leaves)[/dim]")
            messages.append({"role": "assistant", "content": reply})
            continue
        console.print(
            f"[dim]{plural(stats.new_tokens, 'token')}, MAT {stats.mean_accepted_tokens:.2f}, "
            f"α {stats.acceptance_rate:.2f}, {stats.tokens_per_second:.1f} tokens/s; "
            f"prompt {stats.prompt_tokens} tokens, {stats.reused_prompt_tokens} of them kept from before[/dim]"
        )
        messages.append({"role": "assistant", "content": reply})
