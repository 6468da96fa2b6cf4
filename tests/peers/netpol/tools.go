//go:build tools

// Package tools pins kube-network-policies, the NetworkPolicy agent build-peers.sh builds.
package tools

import (
	_ "sigs.k8s.io/kube-network-policies/cmd"
)
