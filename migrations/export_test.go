package migrations

// UpWith is Up with the migrations changed by edit first: tests add one
// that fails.
var UpWith = up
