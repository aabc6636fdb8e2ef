"""One agent process: its pools, its checkpointer (silenced when the process crashes) and its compiled graphs.

An episode of the failure lab (:mod:`agentlab.lab.runner`) runs in an :class:`AgentProcess`; a fault may kill
that process, and the episode then resumes in *another* one, with its own pools, saver, graph, tools node and
model instance, as after a real restart.

- :class:`CrashableSaver`: the kit's checkpointer, whose writes for a thread stop once its process has died
  (a dead process writes nothing, not even the error record LangGraph would store for a failed task).
- :class:`PoolPair`: a process's pools, opened together and closed together on failure.
- :class:`AgentProcess`: compiles one graph per preset and routes each thread to its episode's own model
  and tools node (compiling a graph and binding the tool schemas cost about 4 ms: once per process, not
  per episode).
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.runnables import Runnable, ensure_config
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from agentlab.core.batch import TransactionalToolsNode
from agentlab.core.checkpoints import RetryingSaver
from agentlab.core.graph import RETRY_ATTEMPTS, build_graph
from agentlab.core.safeguards import Safeguards
from agentlab.runtime import connections
from agentlab.runtime.connections import POOL_TIMEOUT_S, agent_pool, checkpointer_pool, tools_pool
from agentlab.runtime.conninfo import check_role_limit
from agentlab.sim.model import ScriptedChatModel


class CrashableSaver(RetryingSaver):
    """The kit's checkpointer (:class:`agentlab.core.checkpoints.RetryingSaver`) whose writes for a thread stop
    once that thread's process has crashed.

    :meth:`kill` marks a thread dead in this saver (this process); later ``aput`` / ``aput_writes``
    for it write nothing, as nothing is written by a process that has died.
    """

    def __init__(self, conn, **kwargs):
        super().__init__(conn, **kwargs)
        self.dead_threads: set[str] = set()

    def kill(self, thread_id: str) -> None:
        self.dead_threads.add(thread_id)

    async def aput(self, config, checkpoint, metadata, new_versions):
        conf = config["configurable"]
        if conf["thread_id"] in self.dead_threads:
            return {"configurable": {"thread_id": conf["thread_id"], "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                     "checkpoint_id": checkpoint["id"]}}
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config, writes, task_id, task_path: str = "") -> None:
        if config["configurable"]["thread_id"] in self.dead_threads:
            return None
        return await super().aput_writes(config, writes, task_id, task_path)


class ModelRouter(Runnable):
    """The graph's model: forwards each call to the scripted model registered for the run's thread.

    A :class:`ScriptedChatModel` is called through its ``_agenerate`` directly: LangChain's generic layer
    around a chat model (callbacks, cache, rate limiter, run ids) costs about 2 ms per episode and
    changes nothing the lab measures; any other model goes through ``ainvoke`` as usual.
    """

    def __init__(self, models: dict[str, Any]):
        self.models = models
        self.tools: list = []

    def bind_tools(self, tools, **kwargs) -> ModelRouter:
        self.tools = tools  # the scripted models play their script; another model gets them bound per call
        return self

    def _model(self, config) -> Any:
        thread_id = ensure_config(config).get("configurable", {}).get("thread_id")
        try:
            return self.models[thread_id]
        except KeyError:
            raise LookupError(f"no model is registered for thread {thread_id!r} in this process") from None

    def invoke(self, input, config=None, **kwargs):
        return self._model(config).invoke(input)

    async def ainvoke(self, input, config=None, **kwargs):
        model = self._model(config)
        if isinstance(model, ScriptedChatModel):
            return (await model._agenerate(list(input))).generations[0].message
        # a real model: the tools bound, the node's callbacks (streamed arguments) along
        return await model.bind_tools(self.tools).ainvoke(input, config)


class _NodeRouter(TransactionalToolsNode):
    """The graph's tools node: runs each batch on the node registered for the batch's thread."""

    def __init__(self, *args, nodes: dict[str, TransactionalToolsNode], **kwargs):
        super().__init__(*args, **kwargs)
        self.nodes = nodes

    async def run_batch(self, tool_calls, *, thread_id: str, **kwargs):
        node = self.nodes.get(thread_id)
        if node is None:
            return await super().run_batch(tool_calls, thread_id=thread_id, **kwargs)
        return await node.run_batch(tool_calls, thread_id=thread_id, **kwargs)


class PoolPair:
    """A process's pools: ``pool`` for the tools and ``checkpointer_pool`` for its saver (and, when it has
    one, ``agent_pool``: the agent role's own login, for isolating presets)."""

    agent_pool: AsyncConnectionPool | None = None

    async def open_pools(self) -> None:
        """Open the pools (waiting for their first connections); on failure or cancellation close
        whichever opened, so no pool keeps reconnecting in the background."""
        try:
            await self.pool.open(wait=True, timeout=POOL_TIMEOUT_S)
            await self.checkpointer_pool.open(wait=True, timeout=POOL_TIMEOUT_S)
            if self.agent_pool is not None:
                await self.agent_pool.open()  # min_size 0: nothing to wait for
        except BaseException as exc:
            try:
                if isinstance(exc, PoolTimeout):  # asked while this process's pools still hold their connections (C53)
                    await asyncio.to_thread(check_role_limit, self.pool.conninfo)
            finally:
                await self.close()
            raise

    async def close(self) -> None:
        await self.checkpointer_pool.close()
        if self.agent_pool is not None:
            await self.agent_pool.close()
        await self.pool.close()


class AgentProcess(PoolPair):
    """What one agent process holds: pools, a checkpointer and compiled graphs, on one database.

    Args:
        url: conninfo of the database.
        provider: the payment provider (the outside world: shared by every process).
        events: where events go.
        toolset: the domain's tools.
        error_hints: the domain's texts for its own constraints (``domain.error_hints``).
        pool_max / checkpointer_max: pool sizes (connections).
        agent_login_refused: why the agent role cannot log in (``Harness.agent_login_refused``), raised as
            :class:`agentlab.runtime.connections.AgentLoginRefused` by a node under isolation; None: it can.

    Under an isolating preset the nodes run on the process's ``agent_pool``, logged in as the agent role
    itself (case C45), as :meth:`agentlab.runtime.harness.Harness.pool_for` does.
    """

    def __init__(self, url: str, *, provider, events, toolset, pool_max: int = 8, checkpointer_max: int = 4,
                 error_hints=None, agent_login_refused: str | None = None):
        self.url = url
        self.agent_login_refused = agent_login_refused
        self.agent_pool = agent_pool(url, max_size=pool_max)
        self.toolset = toolset
        self.error_hints = error_hints
        self.provider = provider
        self.events = events
        self.pool = tools_pool(url, max_size=pool_max, timeout=30.0)  # psycopg_pool's default wait
        self.checkpointer_pool = checkpointer_pool(url, max_size=checkpointer_max)
        self.saver: CrashableSaver | None = None
        self._models: dict[str, Any] = {}
        self._nodes: dict[str, TransactionalToolsNode] = {}
        self._graphs: dict[Safeguards, Any] = {}

    async def open(self) -> AgentProcess:
        """Open both pools (:meth:`PoolPair.open_pools`) and the process's saver."""
        await self.open_pools()
        self.saver = CrashableSaver(self.checkpointer_pool)
        return self

    def pool_for(self, safeguards: Safeguards) -> AsyncConnectionPool:
        """The tools pool under isolation, else the business pool. Raises :class:`AgentLoginRefused`."""
        return connections.pool_for(safeguards, self.pool, self.agent_pool, self.agent_login_refused)

    def node(self, safeguards: Safeguards) -> TransactionalToolsNode:
        """A fresh tools node on this process's pool for ``safeguards`` (its hooks are the episode's own)."""
        node = TransactionalToolsNode(self.pool_for(safeguards), safeguards, toolset=self.toolset, provider=self.provider,
                                      events=self.events, max_attempts=RETRY_ATTEMPTS, error_hints=self.error_hints)
        node.kit_pool = self.pool  # leases and approvals stay off the agent's login (agentlab.core.graph.kit_pool)
        return node

    def graph(self, safeguards: Safeguards):
        """The compiled graph for ``safeguards`` (one per preset per process), with this process's saver."""
        graph = self._graphs.get(safeguards)
        if graph is None:
            router = _NodeRouter(self.pool_for(safeguards), safeguards, toolset=self.toolset, provider=self.provider,
                                 events=self.events, nodes=self._nodes, error_hints=self.error_hints)
            router.kit_pool = self.pool
            graph = build_graph(ModelRouter(self._models), router, checkpointer=self.saver)
            self._graphs[safeguards] = graph
        return graph

    def register(self, thread_id: str, model, node: TransactionalToolsNode) -> None:
        self._models[thread_id] = model
        self._nodes[thread_id] = node

    def release(self, thread_id: str) -> None:
        self._models.pop(thread_id, None)
        self._nodes.pop(thread_id, None)
