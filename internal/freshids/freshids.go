package freshids

import "context"

type key struct{}

// With returns ctx marking the IDs of the appends made under it as fresh.
func With(ctx context.Context) context.Context { return context.WithValue(ctx, key{}, true) }

// In reports whether ctx marks the IDs of its appends as fresh.
func In(ctx context.Context) bool {
	fresh, _ := ctx.Value(key{}).(bool)
	return fresh
}
