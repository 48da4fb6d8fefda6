"""Send what a sweep journaled for a tracking server that was away (orchestrator/record/journal.py).

    python -m orchestrator.replay .phasesweep_journal/sweep-20261203-081500-4242.jsonl
    python -m orchestrator.replay JOURNAL --uri http://127.0.0.1:5000

Each entry the server has not taken is sent once, in order, and marked in JOURNAL.done; a
second replay sends nothing twice. Credentials come from MLFLOW_TRACKING_USERNAME and
MLFLOW_TRACKING_PASSWORD, as for a sweep. Exit status: 0 when everything was sent, 1 when
the server refused an entry or is away (replay again later), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from orchestrator.record.journal import Journal
from orchestrator.record.store import check_reachable, credentials_checked, quick_http
from orchestrator.record.tracking import apply


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.replay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("journal", type=Path, help="the .jsonl file the sweep named")
    p.add_argument("--uri", default=None, help="the tracking server (default: the one the journal was written for)")
    args = p.parse_args(argv)

    if not args.journal.is_file():
        print(f"replay: {args.journal}: no such journal", file=sys.stderr)
        return 2
    journal = Journal(args.journal)
    uri = args.uri or journal.uri
    if not uri:
        print(f"replay: {args.journal} does not say its server: give --uri", file=sys.stderr)
        return 2
    pending = journal.pending()
    if not pending:
        print(f"replay: nothing to send: every entry of {args.journal} was taken by the server already")
        return 0
    quick_http()
    try:
        check_reachable(uri)
    except Exception as e:
        print(f"replay: {e}", file=sys.stderr)
        return 1
    from mlflow.tracking import MlflowClient  # lazy: mlflow, only once a store is opened

    client = MlflowClient(tracking_uri=uri)
    sent = 0
    with credentials_checked(uri):
        for entry in pending:
            if entry["op"] == "artifact" and not Path(entry["args"][1]).is_file():
                print(f"replay: entry {entry['seq']}: {entry['args'][1]} is gone; its artifact is not sent", file=sys.stderr)
                journal.mark(entry["seq"])
                continue
            try:
                apply(client, entry["op"], entry["args"])
            except Exception as e:
                print(f"replay: entry {entry['seq']} ({entry['op']}) failed: {e}; {sent} sent, replay again to send the rest", file=sys.stderr)
                return 1
            journal.mark(entry["seq"])
            sent += 1
    print(f"replay: sent {sent} write(s) of {args.journal} to {uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
