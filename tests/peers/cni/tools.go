//go:build tools

// Package tools pins the CNI reference plugins that build-peers.sh builds.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/bandwidth"
	_ "github.com/containernetworking/plugins/plugins/meta/firewall"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
