"""`flashd ps` and `flashd stop`: the user's resident daemons (clients/resident.py)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import click

from .resident import ResidentDaemon, format_keep_alive, list_resident, stop_resident
from .spawn import DaemonStartError


def _daemons() -> list[tuple[ResidentDaemon, dict | None]]:
    try:
        return list_resident()
    except DaemonStartError as exc:          # an unusable runtime directory
        raise click.ClickException(str(exc)) from None


def _state(status: dict | None) -> str:
    if status is None:
        return "not answering"
    if status.get("running") is not None:
        queued = status.get("queued", 0)
        return "busy" + (f", {queued} queued" if queued else "")
    return "idle"


def _until(daemon: ResidentDaemon, status: dict | None) -> str:
    """When it exits by itself."""
    keep = daemon.keep_alive_s
    if keep is None:
        return "until stopped"
    idle = (status or {}).get("idle_s")
    if idle is None:
        return f"{format_keep_alive(keep)} after its last request"
    return f"in {format_keep_alive(max(0, round(keep - idle)))}"


def _row(daemon: ResidentDaemon, status: dict | None) -> dict:
    ready = daemon.ready
    memory = (status or {}).get("memory") or {}
    return {
        "pid": daemon.pid, "model": ready.get("model"), "name": ready.get("name"),
        "backend": ready.get("backend"), "max_ctx": ready.get("max_ctx"), "drafts": ready.get("drafts") or [],
        "state": _state(status), "served": (status or {}).get("served"),
        "weights_bytes": memory.get("resident_weights_bytes"), "kv_bytes": memory.get("resident_kv_bytes"),
        "keep_alive_s": daemon.keep_alive_s, "idle_s": (status or {}).get("idle_s"),
        "exits": _until(daemon, status), "address": daemon.address, "log": str(daemon.log_path),
    }


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.0f} MiB"


@click.command("ps")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per daemon, one per line.")
def ps_command(as_json):
    """List your resident daemons: model, backend, state, memory and when each exits."""
    rows = [_row(d, s) for d, s in _daemons()]
    if as_json:
        for row in rows:
            click.echo(json.dumps(row))
        return
    if not rows:
        click.echo("no resident daemons")
        return
    for row in rows:
        drafts = f", drafts {', '.join(row['drafts'])}" if row["drafts"] else ""
        click.echo(f"pid {row['pid']}  {row['name'] or Path(str(row['model'])).name}  {row['backend']}, "
                   f"max_ctx {row['max_ctx']}{drafts}  {row['state']}, {row['served']} served  "
                   f"weights {_mib(row['weights_bytes'])}, KV {_mib(row['kv_bytes'])}  exits {row['exits']}")
        click.echo(f"    {row['model']}  log {row['log']}")


def _matches(daemon: ResidentDaemon, target: str) -> bool:
    from .registry import ModelFetchError, ModelNotFoundError, resolve_model

    if target.isdigit() and int(target) == daemon.pid:
        return True
    model = daemon.ready.get("model")
    if model is None:
        return False
    try:
        path = resolve_model(target, download=False, progress=False)
    except (ModelNotFoundError, ModelFetchError, ValueError, OSError):   # not here: match the file name
        return Path(model).name == target
    return Path(model).resolve() == Path(path).resolve()


@click.command("stop")
@click.argument("targets", nargs=-1, metavar="[MODEL|PID]...")
def stop_command(targets):
    """Stop resident daemons: those serving MODEL (a name or path) or with that PID; all of
    yours when none is given. A request still running is cancelled."""
    daemons = [d for d, _ in _daemons()]
    chosen = [d for d in daemons if not targets or any(_matches(d, t) for t in targets)]
    if not chosen:
        click.echo("no resident daemon " + (f"matches {' '.join(targets)}" if targets else "is running"), err=True)
        if targets:
            raise SystemExit(1)
        return
    for daemon in chosen:
        started = time.perf_counter()
        how = stop_resident(daemon)
        click.echo(f"stopped pid {daemon.pid} ({daemon.ready.get('name') or daemon.ready.get('model')}) by {how} "
                   f"in {time.perf_counter() - started:.1f} s")
