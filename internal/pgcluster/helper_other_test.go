//go:build !linux

package pgcluster

func runHelperOwner() {}
