// Package hookedpool makes, for tests, a pgx pool whose login comes only from
// its BeforeConnect hook, as a pool with rotating credentials (an RDS IAM
// token, say) logs in: the pool's ConnConfig names a role that does not
// exist, and the hook puts the real one in. A connection that annals opens
// itself (a lock session, a listener, a replication connection) logs in
// only if it runs the pool's hooks, so a test that works on such a pool
// shows that it does.
package hookedpool
