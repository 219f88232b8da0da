"""One end of a transfer in a Python process of its own, for the tests.

    python peer.py send    '{"paths": [...], "to": ..., "code": ..., ...}'
    python peer.py receive '{"out": ..., "listen": ..., "code": ..., ...}'

Prints one JSON object per line on stdout: {"ready": ADDRESS, "code": CODE} once a receiver
listens, {"event": ...} for each progress event when "events" is true, then {"summary": {...}}
(exit 0), {"error": CLASS, "kind": ..., "exit_code": ...} (exit with that code), or
{"interrupted": true} after Ctrl-C (exit 130).
"""

import json
import sys

import hurtle


def say(obj):
    print(json.dumps(obj), flush=True)


def main():
    role, opts = sys.argv[1], json.loads(sys.argv[2])
    if opts.pop("events", False):
        opts["progress"] = say
    try:
        if role == "receive":
            out = opts.pop("out")
            summary = hurtle.receive(out, ready=lambda a, c: say({"ready": a, "code": c}), **opts)
        else:
            summary = hurtle.send(opts.pop("paths"), **opts)
    except hurtle.Error as e:
        say({"error": type(e).__name__, "kind": e.kind, "exit_code": e.exit_code, "message": str(e)})
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        say({"interrupted": True})
        sys.exit(130)
    say({"summary": summary})


if __name__ == "__main__":
    main()
