"""``python -m agentlab``: the command line (:mod:`agentlab.cli.main`)."""

from agentlab.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
