"""The lab's clients: the agent under test, one per episode, played by the one loop (:mod:`agentlab.lab.loop`).

- :mod:`agentlab.lab.clients.kit`: the kit's own graph under a preset (``Lab.run``);
- :mod:`agentlab.lab.clients.graph_agent`: a LangGraph agent as its user builds it (``Yardstick.run``).
"""
