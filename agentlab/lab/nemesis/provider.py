"""Faults of the payment provider: a request that times out after the provider did the work, and the caller of
the provider dying after the call (days later: after the provider forgot the idempotency key).

Part of the fault catalog (:mod:`agentlab.lab.faults`, its registry and table).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentlab.lab.nemesis.base import EpisodeRunLike, Fault

PAYMENT_SCENARIOS = ("refund", "invoice", "topup", "batch")  # the first customer is paid or refunded


@dataclass(frozen=True)
class ProviderTimeoutAfterSuccess(Fault):
    """The provider performs the episode's first payment, then the caller's request times out."""

    scenarios: tuple[str, ...] = PAYMENT_SCENARIOS

    async def arm(self, run: EpisodeRunLike) -> None:
        run.provider.fail_next("timeout_after_success", customer_id=run.customer_ids[0])
        run.notes["provider_fault"] = "timeout_after_success"

    async def disarm(self, run: EpisodeRunLike) -> None:
        run.notes["provider_fault_unused"] = run.provider.clear_faults(customer_id=run.customer_ids[0])


class DiesAfterPayment:
    """The provider as a process sees it, the process dying once a payment call has returned (once per run).

    ``run`` is an episode run (``crash(where)``, ``notes``); ``where`` says where the process died;
    ``note_payment`` records the returned payment's id as ``notes["paid_before_crash"]``."""

    def __init__(self, provider, run: EpisodeRunLike, *,
                 where: str = "after the provider call, before the batch commit", note_payment: bool = True):
        self._provider, self._run = provider, run
        self._where, self._note_payment = where, note_payment

    def __getattr__(self, name):
        return getattr(self._provider, name)

    async def _after(self, response: dict) -> dict:
        if not self._run.notes.get("crashes"):
            if self._note_payment:
                self._run.notes["paid_before_crash"] = response["id"]
            raise self._run.crash(self._where)
        return response

    async def create_charge(self, *args, **kwargs) -> dict:
        return await self._after(await self._provider.create_charge(*args, **kwargs))

    async def create_refund(self, *args, **kwargs) -> dict:
        return await self._after(await self._provider.create_refund(*args, **kwargs))


@dataclass(frozen=True)
class CrashAfterProviderCall(Fault):
    """The process that calls the provider dies after the provider did the work and before recording it:
    the outbox worker (before marking the row dispatched) or, with the outbox off, the tools node
    (before its batch commits). A new process resumes; ``forget_keys`` moves the provider's clock past
    its idempotency-key retention first (the resume comes days later)."""

    forget_keys: bool = False
    scenarios: tuple[str, ...] = PAYMENT_SCENARIOS
    resumes = True

    def resumes_graph(self, safeguards) -> bool:
        return not safeguards.outbox  # with the outbox it is the worker that dies, after the graph finished

    async def arm(self, run: EpisodeRunLike) -> None:
        if run.safeguards.outbox:
            def die(row_id: int) -> None:
                if not run.notes.get("crashes"):
                    run.notes.setdefault("crashes", []).append("worker, after the provider call")
                    run.notes["row_before_crash"] = row_id
                    from agentlab.core.errors import SimulatedCrash
                    raise SimulatedCrash(f"simulated worker crash after the provider call (row {row_id})")

            run.worker.hooks.after_provider_call.append(die)
        else:
            run.node.provider = DiesAfterPayment(run.node.provider, run)

    async def before_restart(self, run: EpisodeRunLike) -> None:
        if self.forget_keys:
            days = run.provider.retention_s + 2 * 86400
            run.provider.clock.advance(days)
            run.notes["clock_advanced_s"] = days
