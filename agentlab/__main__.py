"""``python -m agentlab``: the command line (:mod:`agentlab.cli.main`)."""

import sys

try:
    from agentlab.cli.main import main
except KeyboardInterrupt:  # Ctrl-C while Python loads the command line itself: one line, as anywhere later
    print("agentlab: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

if __name__ == "__main__":
    raise SystemExit(main())
