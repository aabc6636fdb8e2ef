"""The billing domain: customers, invoices, credit memos and refunds."""
