//go:build tools

// Package tools pins the cri-tools commands that build-peers.sh builds.
package tools

import (
	_ "sigs.k8s.io/cri-tools/cmd/crictl"
	_ "sigs.k8s.io/cri-tools/cmd/critest"
)
