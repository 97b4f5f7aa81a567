"""Every flag of run, chat, serve and bench can be set by an environment variable,
TALLOW_<FLAG> (`--top-k` is TALLOW_TOP_K), shown in --help as `[env var: ...]`; a flag given on
the command line wins, and a bad value is refused naming the variable.

The rule is applied here, once, to the commands as they are loaded (cli/app.py), so a flag
added to one of them has its variable with nothing else to write. Two kinds of flag depart
from it, each named below: those that already read a variable declared in env/settings.py
(that variable keeps its meaning and its reading; the help names it), and the few whose
TALLOW_<FLAG> would mean something else on another command, which take the command's name
(TALLOW_SERVE_HOST: TALLOW_HOST is where ps and stop find a server)."""

from __future__ import annotations

from typing import Any

from tallow.env import settings

MIRRORED = ("run", "chat", "serve", "bench")

# A flag -> the declared variable it already reads (env/settings.py), per command or for all.
READS: dict[tuple[str, str], str] = {
    **{(c, "--offline"): settings.OFFLINE.name for c in MIRRORED},
    **{(c, "--no-log"): settings.NO_LOG.name for c in ("run", "chat")},
    **{(c, "--endpoint"): settings.ENDPOINT.name for c in ("run", "chat", "bench")},
    **{(c, "--api-key"): settings.ENDPOINT_KEY.name for c in ("run", "chat", "bench")},
    ("serve", "--api-key"): settings.API_KEY.name,
    ("serve", "--keep-alive"): settings.KEEP_ALIVE.name,
}
# Flags whose plain TALLOW_<FLAG> means something else elsewhere: scoped by the command.
SCOPED = {("serve", "--host"), ("serve", "--max-tokens"), ("bench", "--parallel")}


def flag_name(param: Any) -> str | None:
    """The flag a parameter is known by: its longest --name (None: an argument, or -pg alone)."""
    longs = [o for o in param.opts if o.startswith("--")]
    return max(longs, key=len) if longs else None


def variable(command: str, param: Any) -> str | None:
    """The environment variable of one option of `command`; None where it has none."""
    if param.param_type_name != "option" or getattr(param, "is_eager", False) or param.hidden:
        return None
    flag = flag_name(param)
    if flag is None or flag == "--help":
        return None
    if (command, flag) in READS:
        return READS[(command, flag)]
    scope = f"{command.upper()}_" if (command, flag) in SCOPED else ""
    return "TALLOW_" + scope + flag[2:].upper().replace("-", "_")


def mirror(command: str, click_command: Any) -> Any:
    """`click_command` (run, chat, serve or bench) with each option's variable attached."""
    attached: dict[str, tuple[str, str]] = {}  # flag -> (parameter, variable)
    parsing: dict[str, Any] = {}  # the context the options were parsed in, for the body's refusals
    for param in click_command.params:
        name, flag = variable(command, param), flag_name(param)
        if name is None or flag is None:
            continue
        if (command, flag) in READS:  # read by the command itself, as before: only shown
            if name not in (param.help or ""):
                param.help = f"{param.help or ''} (also {name})".strip()
            continue
        param.envvar, param.show_envvar = name, True
        _name_the_variable(param, name, parsing)
        attached[flag] = (param.name, name)
    click_command.callback = _checked_in_the_body(click_command.callback, attached, parsing)
    return click_command


def _checked_in_the_body(callback: Any, attached: dict[str, tuple[str, str]], parsing: dict[str, Any]) -> Any:
    """The command, with a refusal of a flag's value that its body makes (a list it parses,
    say) naming the variable when the value came from there."""
    import functools

    import typer

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except typer.BadParameter as exc:
            ctx = exc.ctx or parsing.get("ctx")
            hint = exc.param_hint if isinstance(exc.param_hint, str) else None
            param, name = attached.get(hint or "", (None, None))
            source = ctx.get_parameter_source(param) if ctx is not None and param else None
            if source is None or source.name != "ENVIRONMENT":
                raise
            raise typer.BadParameter(exc.message, ctx=ctx, param_hint=f"{name} (from the environment)") from None

    return run


def _name_the_variable(param: Any, name: str, parsing: dict[str, Any]) -> None:
    """A value from the environment that the option refuses is refused naming the variable."""
    import typer

    process = param.process_value

    def process_value(ctx: Any, value: Any) -> Any:
        parsing["ctx"] = ctx
        try:
            return process(ctx, value)
        except typer.BadParameter as exc:
            source = ctx.get_parameter_source(param.name)
            if source is None or source.name != "ENVIRONMENT":
                raise
            raise typer.BadParameter(exc.message, ctx=ctx, param_hint=f"{name} (from the environment)") from None

    param.process_value = process_value
