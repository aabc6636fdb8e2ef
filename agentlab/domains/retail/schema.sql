-- tau2-bench's retail domain (sierra-research/tau2-bench a2c0247) as PostgreSQL tables in schema retail.
--
-- Every field of tau2's RetailDB JSON (domains/retail/data_model.py) has a column, so that
-- agentlab.domains.retail.export gives back exactly tau2's shape:
--   * money is integer cents (bigint); export divides by 100 (tau2 keeps floats);
--   * a JSON list keeps its order in a position / seq column (0-based, the list index), or is a
--     text[] when it is a list of plain strings (tracking ids, item ids, exchange and return items);
--   * a JSON dict's key order is irrelevant to tau2's hash (sort_keys), but the dicts' insertion
--     order (products, variants, users, payment methods, orders) is kept in position too, so that
--     look-ups that take the first match (find_user_id_by_*) scan in tau2's order;
--   * a user's "orders" list is orders.user_position (the place of the order in that list);
--   * a nested address is flattened into address1, address2, city, country, state, zip;
--   * an item's options (a dict of strings) is a jsonb object of strings;
--   * the payment method variants share one table, with a CHECK on which columns each source has.
-- Constraints tau2 leaves to its Python code are the database's job here: gift card balance never
-- below zero, status and cancel reason in tau2's Literal values, a payment method used by an order
-- belongs to the order's user, an order item names a variant of its own product, unique e-mail.

CREATE SCHEMA retail;

CREATE TABLE retail.products (
    product_id text PRIMARY KEY,
    position   integer NOT NULL,
    name       text NOT NULL,
    CONSTRAINT products_position_unique UNIQUE (position),
    CONSTRAINT products_name_unique UNIQUE (name)  -- list_all_product_types maps name -> id
);

CREATE TABLE retail.variants (
    item_id     text PRIMARY KEY,
    product_id  text NOT NULL REFERENCES retail.products,
    position    integer NOT NULL,  -- place in the product's variants dict
    options     jsonb NOT NULL,
    available   boolean NOT NULL,
    price_cents bigint NOT NULL,
    CONSTRAINT variants_position_unique UNIQUE (product_id, position),
    CONSTRAINT variants_product_item_unique UNIQUE (product_id, item_id),  -- target of order_items' FK
    CONSTRAINT variants_price_nonnegative CHECK (price_cents >= 0),
    CONSTRAINT variants_options_strings CHECK (
        jsonb_typeof(options) = 'object' AND NOT jsonb_path_exists(options, '$.* ? (@.type() != "string")')
    )
);

CREATE TABLE retail.users (
    user_id    text PRIMARY KEY,
    position   integer NOT NULL,
    first_name text NOT NULL,
    last_name  text NOT NULL,
    address1   text NOT NULL,
    address2   text NOT NULL,
    city       text NOT NULL,
    country    text NOT NULL,
    state      text NOT NULL,
    zip        text NOT NULL,
    email      text NOT NULL,
    CONSTRAINT users_position_unique UNIQUE (position),
    CONSTRAINT users_email_unique UNIQUE (email)
);
-- find_user_id_by_email compares case-insensitively: one user per e-mail whatever its case
CREATE UNIQUE INDEX users_email_lower_unique ON retail.users (lower(email));
CREATE INDEX users_zip ON retail.users (zip);  -- find_user_id_by_name_zip

CREATE TABLE retail.payment_methods (
    payment_method_id text PRIMARY KEY,
    user_id           text NOT NULL REFERENCES retail.users,
    position          integer NOT NULL,  -- place in the user's payment_methods dict
    source            text NOT NULL,
    brand             text,    -- credit_card only
    last_four         text,    -- credit_card only
    balance_cents     bigint,  -- gift_card only
    CONSTRAINT payment_methods_position_unique UNIQUE (user_id, position),
    CONSTRAINT payment_methods_user_unique UNIQUE (user_id, payment_method_id),  -- target of ownership FKs
    CONSTRAINT payment_methods_source_valid CHECK (source IN ('credit_card', 'gift_card', 'paypal')),
    CONSTRAINT payment_methods_source_fields CHECK (
        CASE source
            WHEN 'credit_card' THEN brand IS NOT NULL AND last_four IS NOT NULL AND balance_cents IS NULL
            WHEN 'gift_card' THEN brand IS NULL AND last_four IS NULL AND balance_cents IS NOT NULL
            ELSE brand IS NULL AND last_four IS NULL AND balance_cents IS NULL
        END
    ),
    CONSTRAINT payment_methods_gift_card_balance_nonnegative CHECK (balance_cents >= 0)
);

CREATE TABLE retail.orders (
    order_id                        text PRIMARY KEY,
    position                        integer NOT NULL,
    user_id                         text NOT NULL REFERENCES retail.users,
    user_position                   integer NOT NULL,  -- place of this order in the user's orders list
    address1                        text NOT NULL,
    address2                        text NOT NULL,
    city                            text NOT NULL,
    country                         text NOT NULL,
    state                           text NOT NULL,
    zip                             text NOT NULL,
    status                          text NOT NULL,
    cancel_reason                   text,
    exchange_items                  text[],
    exchange_new_items              text[],
    exchange_payment_method_id      text,
    exchange_price_difference_cents bigint,  -- may be negative: the customer gets money back
    return_items                    text[],
    return_payment_method_id        text,
    CONSTRAINT orders_position_unique UNIQUE (position),
    CONSTRAINT orders_user_position_unique UNIQUE (user_id, user_position),
    CONSTRAINT orders_user_unique UNIQUE (order_id, user_id),  -- target of payment_history's FK
    CONSTRAINT orders_status_valid CHECK (status IN (
        'processed', 'pending', 'pending (item modified)', 'delivered', 'cancelled',
        'exchange requested', 'return requested'
    )),
    CONSTRAINT orders_cancel_reason_valid CHECK (cancel_reason IN ('no longer needed', 'ordered by mistake')),
    CONSTRAINT orders_cancel_reason_when_cancelled CHECK (cancel_reason IS NULL OR status = 'cancelled'),
    -- an exchange request sets its four fields at once, a return request its two
    CONSTRAINT orders_exchange_fields_together CHECK (
        (exchange_items IS NULL) = (exchange_new_items IS NULL)
        AND (exchange_items IS NULL) = (exchange_payment_method_id IS NULL)
        AND (exchange_items IS NULL) = (exchange_price_difference_cents IS NULL)
    ),
    CONSTRAINT orders_return_fields_together CHECK ((return_items IS NULL) = (return_payment_method_id IS NULL)),
    CONSTRAINT orders_exchange_payment_method_owned FOREIGN KEY (user_id, exchange_payment_method_id)
        REFERENCES retail.payment_methods (user_id, payment_method_id),
    CONSTRAINT orders_return_payment_method_owned FOREIGN KEY (user_id, return_payment_method_id)
        REFERENCES retail.payment_methods (user_id, payment_method_id)
);

CREATE TABLE retail.order_items (
    order_id    text NOT NULL REFERENCES retail.orders,
    position    integer NOT NULL,  -- the index in the order's items list
    item_id     text NOT NULL,
    product_id  text NOT NULL,
    name        text NOT NULL,
    price_cents bigint NOT NULL,   -- the price at purchase (or as modify_pending_order_items left it)
    options     jsonb NOT NULL,
    PRIMARY KEY (order_id, position),
    CONSTRAINT order_items_variant_of_product FOREIGN KEY (product_id, item_id)
        REFERENCES retail.variants (product_id, item_id),
    CONSTRAINT order_items_price_nonnegative CHECK (price_cents >= 0),
    CONSTRAINT order_items_options_strings CHECK (
        jsonb_typeof(options) = 'object' AND NOT jsonb_path_exists(options, '$.* ? (@.type() != "string")')
    )
);

CREATE TABLE retail.fulfillments (
    order_id     text NOT NULL REFERENCES retail.orders,
    position     integer NOT NULL,  -- the index in the order's fulfillments list
    tracking_ids text[] NOT NULL,   -- tau2's "tracking_id" (a list)
    item_ids     text[] NOT NULL,
    PRIMARY KEY (order_id, position)
);

CREATE TABLE retail.payment_history (
    order_id          text NOT NULL,
    seq               integer NOT NULL,  -- the index in the order's payment_history list
    user_id           text NOT NULL,     -- the order's user: lets the FK below check ownership
    transaction_type  text NOT NULL,
    amount_cents      bigint NOT NULL,
    payment_method_id text NOT NULL,
    PRIMARY KEY (order_id, seq),
    CONSTRAINT payment_history_order FOREIGN KEY (order_id, user_id) REFERENCES retail.orders (order_id, user_id),
    CONSTRAINT payment_history_payment_method_owned FOREIGN KEY (user_id, payment_method_id)
        REFERENCES retail.payment_methods (user_id, payment_method_id),
    CONSTRAINT payment_history_type_valid CHECK (transaction_type IN ('payment', 'refund')),
    CONSTRAINT payment_history_amount_nonnegative CHECK (amount_cents >= 0)
);
CREATE INDEX payment_history_payment_method ON retail.payment_history (user_id, payment_method_id);

COMMENT ON SCHEMA retail IS 'tau2-bench retail domain (sierra-research/tau2-bench a2c0247, MIT); money in cents';
COMMENT ON COLUMN retail.payment_methods.balance_cents IS 'gift card balance in cents, never below zero';
COMMENT ON COLUMN retail.orders.user_position IS 'index of this order in its user''s orders list';
