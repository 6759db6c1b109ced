// Package poolconn opens the connections annals needs outside a pool (a
// lock's session, a LISTEN connection, a replication connection) the way a
// pgxpool.Pool opens its own: from a copy of the pool's ConnConfig, with the
// pool's BeforeConnect run on that copy at every dial, and its AfterConnect
// run on the new connection.
//
// BeforeConnect is pgxpool's documented place to supply credentials that
// change (an RDS IAM token as the password, a user name from a secrets
// store): a connection made from pool.Config().ConnConfig alone carries the
// placeholder the pool was configured with, and fails to log in. Running it
// at each dial, reconnects included, picks up a rotated token as the pool
// does. AfterConnect is where an application registers types or sets up the
// session; running it keeps annals' own connections alike the pool's.
package poolconn
