// Command etcd starts one embedded etcd member: the etcd binary's own main
// package lives in a module the proxy does not serve.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "directory for the member's data (required)")
	client := flag.String("listen-client-urls", "http://127.0.0.1:2379", "client URL")
	peer := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL")
	flag.Parse()
	if *dataDir == "" {
		log.Fatal("etcd: --data-dir is required")
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.Name = "netplugin-test"
	cfg.LogLevel = "warn"
	cu, err := url.Parse(*client)
	if err != nil {
		log.Fatalf("etcd: --listen-client-urls: %v", err)
	}
	pu, err := url.Parse(*peer)
	if err != nil {
		log.Fatalf("etcd: --listen-peer-urls: %v", err)
	}
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd: start: %v", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		log.Fatal("etcd: not ready within 60 s")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Fatalf("etcd: %v", err)
	}
}
