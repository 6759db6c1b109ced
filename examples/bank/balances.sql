-- The bank_balances read model: one row per account, kept by the
-- bank.balances projection in the transactions that move its checkpoint.

-- name: CreateTable
CREATE TABLE IF NOT EXISTS bank_balances (
    account_id  text PRIMARY KEY,
    owner       text NOT NULL,
    balance     bigint NOT NULL DEFAULT 0, -- cents
    deposits    int NOT NULL DEFAULT 0,
    withdrawals int NOT NULL DEFAULT 0,
    version     bigint NOT NULL,           -- stream version of the last event applied
    updated_at  timestamptz NOT NULL
);

-- name: Truncate
TRUNCATE bank_balances;

-- name: Open
INSERT INTO bank_balances (account_id, owner, version, updated_at)
VALUES ($1, $2, $3, $4);

-- name: Deposit
UPDATE bank_balances
   SET balance = balance + $2, deposits = deposits + 1, version = $3, updated_at = $4
 WHERE account_id = $1;

-- name: Withdraw
UPDATE bank_balances
   SET balance = balance - $2, withdrawals = withdrawals + 1, version = $3, updated_at = $4
 WHERE account_id = $1;

-- name: List
SELECT account_id, owner, balance, deposits, withdrawals, version
  FROM bank_balances
 WHERE account_id LIKE $1
 ORDER BY account_id;
