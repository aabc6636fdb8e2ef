"""The lab's workloads: what the agent under test is asked, episode by episode (Jepsen's generator).

- :mod:`agentlab.lab.workloads.scenarios`: a domain's scenarios, one chosen by the seed among those the
  fault fits and prepared by the fault (a hallucinated argument written into the script, say);
- tau2's tasks are scenarios of the retail domain, replayed through the same path
  (:mod:`agentlab.lab.tau2`);
- the concurrency family plays two conversations at once (:mod:`agentlab.lab.concurrency`).
"""
