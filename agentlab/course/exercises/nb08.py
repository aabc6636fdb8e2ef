"""Exercises of notebook 08 (the outbox and the payment provider)."""

from agentlab.course.exercises import Case, Exercise

EXERCISES = (
    Exercise(
        id="8.1", title="Days later, the provider has forgotten the key", function="late_recovery",
        solution="agentlab.course.solutions.ex08_outbox:late_recovery",
        cases=(Case(kwargs={"days": 3}, expected={"status": "dispatched", "reconciled": 1, "charges_at_provider": 1}),),
        hints={
            "status": "SELECT status FROM outbox WHERE dedupe_key = %s, with charge_dedupe_key(customer, '2026-03-01')",
            "reconciled": "the DrainStats of the second drain: stats.reconciled",
            "charges_at_provider": "the customer's provider payments of kind 'charge'",
            "*": "h.worker.hooks.after_provider_call.append(f) with f raising SimulatedCrash; catch it around "
                 "the first drain, remove the hook, h.provider.clock.advance(days * 86400), drain again",
        },
    ),
    Exercise(
        id="8.2", title="Two workers, one queue", function="two_workers",
        solution="agentlab.course.solutions.ex08_outbox:two_workers",
        cases=(Case(expected={"dispatched": 10, "charges_at_provider": 10, "distinct_references": 10}),),
        hints={
            "dispatched": "a.dispatched + b.dispatched of the two workers' DrainStats",
            "charges_at_provider": "the customer's provider payments of kind 'charge'",
            "distinct_references": "the distinct p['reference'] among those charges",
            "*": "two OutboxWorker(h.pool, h.provider, batch_size=3) drained under asyncio.gather",
        },
    ),
)
