package replica

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/membership"
	"github.com/prefixrouter/prefixrouter/overload"
	"github.com/prefixrouter/prefixrouter/router"
)

// validStatic is the smallest valid tree: a static fleet of one.
func validStatic() Options {
	return Options{
		Router: router.Options{DefaultEndpoint: "chat"},
		Static: []fleet.Instance{{ID: "a", Addr: "http://127.0.0.1:1"}},
	}
}

// validEtcd is the smallest valid tree with etcd.
func validEtcd() Options {
	return Options{Router: router.Options{DefaultEndpoint: "chat"}}
}

type validateCase struct {
	field string // the setting's path in the tree
	base  func() Options
	set   func(*Options)
	want  string // "" = valid; else a substring of the error
}

// validateCases cover every setting of the options tree: a value in range, a
// value out of range, and zero (which means the default and is valid).
// TestValidateCoversEverySetting checks that no setting is missing.
var validateCases = []validateCase{
	{"ID", validEtcd, func(o *Options) { o.ID = "router-1" }, ""},
	{"ID", validEtcd, func(o *Options) { o.ID = "a/b" }, "replica id"},
	{"ID", validEtcd, func(o *Options) { o.ID = "" }, ""},
	{"Listen", validStatic, func(o *Options) { o.Listen = "127.0.0.1:0" }, ""},
	{"Listen", validStatic, func(o *Options) { o.Listen = "" }, ""},
	{"AdminListen", validStatic, func(o *Options) { o.AdminListen = "127.0.0.1:0" }, ""},
	{"AdminListen", validStatic, func(o *Options) { o.AdminListen = "" }, ""},
	{"ExtProcListen", validStatic, func(o *Options) { o.ExtProcListen = ":9002" }, ""},
	{"ExtProcListen", validStatic, func(o *Options) { o.ExtProcListen = "9002" }, "--ext-proc-listen"},
	{"ExtProcListen", validStatic, func(o *Options) { o.ExtProcListen = "" }, ""},
	{"OTLPEndpoint", validStatic, func(o *Options) { o.OTLPEndpoint = "http://collector:4317" }, ""},
	{"OTLPEndpoint", validStatic, func(o *Options) { o.OTLPEndpoint = "collector:4317" }, ""},
	{"OTLPEndpoint", validStatic, func(o *Options) { o.OTLPEndpoint = "ftp://collector:4317" }, "--otlp-endpoint"},
	{"OTLPEndpoint", validStatic, func(o *Options) { o.OTLPEndpoint = "collector" }, "--otlp-endpoint"},
	{"OTLPEndpoint", validStatic, func(o *Options) { o.OTLPEndpoint = "" }, ""},
	{"Static", validStatic, func(o *Options) { o.Static = append(o.Static, fleet.Instance{ID: "b", Addr: "http://127.0.0.1:2"}) }, ""},
	{"Static", validStatic, func(o *Options) { o.Static = []fleet.Instance{{ID: "", Addr: "http://x"}} }, "static instance 0"},
	{"Static", validStatic, func(o *Options) { o.Static = nil }, ""}, // then etcd, at its default URL
	{"Static", validStatic, func(o *Options) { o.Etcd.Endpoints = []string{"http://127.0.0.1:2379"} }, "excludes etcd endpoints"},
	{"Static", validStatic, func(o *Options) { o.EmbeddedEtcdDir = "/tmp/x" }, "excludes etcd endpoints"},
	{"AllowedUpstreams", validStatic, func(o *Options) { o.AllowedUpstreams = []string{"127.0.0.0/8", "vllm.internal", ".svc.cluster.local"} }, ""},
	{"AllowedUpstreams", validStatic, func(o *Options) { o.AllowedUpstreams = []string{"10.0.0.0/40"} }, "--allowed-upstreams"},
	{"AllowedUpstreams", validStatic, func(o *Options) { o.AllowedUpstreams = []string{"10.0.0.0/8"} }, "outside the allowed upstreams"},
	{"AllowedUpstreams", validStatic, func(o *Options) { o.Static[0].Addr = "http://169.254.169.254" }, "outside the allowed upstreams"},
	{"AllowedUpstreams", validStatic, func(o *Options) { o.AllowedUpstreams = nil }, ""},
	{"Routing", validStatic, func(o *Options) { o.Routing = fleet.RoutingConfig{} }, ""},
	{"Routing.RoutingStrategy", validStatic, func(o *Options) { o.Routing.RoutingStrategy = fleet.Random }, ""},
	{"Routing.RoutingStrategy", validStatic, func(o *Options) { o.Routing.RoutingStrategy = "ROUND_ROBIN" }, "RoutingStrategy"},
	{"Routing.RoutingStrategy", validStatic, func(o *Options) { o.Routing.RoutingStrategy = "" }, ""},
	{"Routing.PrefixAwareRoutingConfig.PrefixLength", validStatic, func(o *Options) { o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{PrefixLength: 8192} }, ""},
	{"Routing.PrefixAwareRoutingConfig.PrefixLength", validStatic, func(o *Options) { o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{PrefixLength: 100} }, "PrefixLength 100"},
	{"Routing.PrefixAwareRoutingConfig.PrefixLength", validStatic, func(o *Options) { o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{PrefixLength: 70000} }, "PrefixLength 70000"},
	{"Routing.PrefixAwareRoutingConfig.PrefixLength", validStatic, func(o *Options) { o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{} }, ""},
	{"Routing.PrefixAwareRoutingConfig.ConcurrencyThreshold", validStatic, func(o *Options) {
		o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{ConcurrencyThreshold: 20}
	}, ""},
	{"Routing.PrefixAwareRoutingConfig.ConcurrencyThreshold", validStatic, func(o *Options) {
		o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{ConcurrencyThreshold: 2000}
	}, "ConcurrencyThreshold 2000"},
	{"Routing.PrefixAwareRoutingConfig.ConcurrencyThreshold", validStatic, func(o *Options) {
		o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{ConcurrencyThreshold: -1}
	}, "ConcurrencyThreshold -1"},
	{"Routing.PrefixAwareRoutingConfig.ConcurrencyThreshold", validStatic, func(o *Options) { o.Routing.PrefixAwareRoutingConfig = nil }, ""},
	{"Routing.PrefixAwareRoutingConfig.HotKeyReplication", validStatic, func(o *Options) {
		o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{HotKeyReplication: true}
	}, ""},
	{"Routing.PrefixAwareRoutingConfig.HotKeyReplication", validStatic, func(o *Options) { o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{} }, ""},
	{"Routing.PrefixAwareRoutingConfig.FixedLengthKeys", validStatic, func(o *Options) {
		o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{FixedLengthKeys: true}
	}, ""},
	{"Routing.PrefixAwareRoutingConfig.FixedLengthKeys", validStatic, func(o *Options) { o.Routing.PrefixAwareRoutingConfig = &fleet.PrefixAwareConfig{} }, ""},
	{"Routing.TenantCacheSalt", validStatic, func(o *Options) { o.Routing.TenantCacheSalt = true }, ""},
	{"Routing.TenantCacheSalt", validStatic, func(o *Options) { o.Routing.TenantCacheSalt = false }, ""},
	{"Routing.ProductionVariants", validStatic, func(o *Options) {
		o.Routing.ProductionVariants = []fleet.ProductionVariant{{VariantName: "blue", InitialVariantWeight: 4}, {VariantName: "green", InitialVariantWeight: 0}}
	}, ""},
	{"Routing.ProductionVariants", validStatic, func(o *Options) {
		o.Routing.ProductionVariants = []fleet.ProductionVariant{{VariantName: "blue", InitialVariantWeight: -1}}
	}, `InitialVariantWeight -1 of "blue"`},
	{"Routing.ProductionVariants", validStatic, func(o *Options) {
		o.Routing.ProductionVariants = []fleet.ProductionVariant{{VariantName: "blue", InitialVariantWeight: 2e6}}
	}, `InitialVariantWeight 2e+06 of "blue"`},
	{"Routing.ProductionVariants", validStatic, func(o *Options) { o.Routing.ProductionVariants = []fleet.ProductionVariant{{VariantName: "blue"}} }, "sum to 0"},
	{"Routing.ProductionVariants", validStatic, func(o *Options) {
		o.Routing.ProductionVariants = []fleet.ProductionVariant{{VariantName: "a", InitialVariantWeight: 1}, {VariantName: "a", InitialVariantWeight: 1}}
	}, "unique"},
	{"Routing.ProductionVariants", validStatic, func(o *Options) { o.Routing.ProductionVariants = nil }, ""},
	{"Routing.FirstByteTimeoutInMilliseconds", validStatic, func(o *Options) { o.Routing.FirstByteTimeoutInMilliseconds = 90_000 }, ""},
	{"Routing.FirstByteTimeoutInMilliseconds", validStatic, func(o *Options) { o.Routing.FirstByteTimeoutInMilliseconds = fleet.MaxFirstByteTimeoutMillis }, ""},
	{"Routing.FirstByteTimeoutInMilliseconds", validStatic, func(o *Options) { o.Routing.FirstByteTimeoutInMilliseconds = -1 }, "FirstByteTimeoutInMilliseconds -1"},
	{"Routing.FirstByteTimeoutInMilliseconds", validStatic, func(o *Options) {
		o.Routing.FirstByteTimeoutInMilliseconds = fleet.MaxFirstByteTimeoutMillis + 1
	}, "FirstByteTimeoutInMilliseconds 3600001"},
	{"Routing.FirstByteTimeoutInMilliseconds", validStatic, func(o *Options) { o.Routing.FirstByteTimeoutInMilliseconds = 0 }, ""},
	{"RoutingFlags", validEtcd, func(o *Options) { o.RoutingFlags = []string{"strategy", "upstream-first-byte-timeout"} }, ""},
	{"RoutingFlags", validEtcd, func(o *Options) { o.RoutingFlags = []string{"--strategy"} }, `RoutingFlags: "--strategy"`},
	{"RoutingFlags", validEtcd, func(o *Options) { o.RoutingFlags = nil }, ""},
	{"Etcd", validEtcd, func(o *Options) { o.Etcd.Endpoints = []string{"http://10.0.0.1:2379", "http://10.0.0.2:2379"} }, ""},
	{"Etcd", validEtcd, func(o *Options) { o.Etcd.Endpoints = []string{"ftp://10.0.0.1:2379"} }, "scheme"},
	{"Etcd", validEtcd, func(o *Options) { o.Etcd.Cert = "c.pem" }, "etcd"},
	{"Etcd", validEtcd, func(o *Options) { o.Etcd.DialTimeout = -time.Second }, "etcd"},
	{"Etcd", validEtcd, func(o *Options) { o.Etcd = membership.ClientOptions{} }, ""},
	{"EmbeddedEtcdDir", validEtcd, func(o *Options) { o.EmbeddedEtcdDir = "/tmp/etcd" }, ""},
	{"EmbeddedEtcdDir", validEtcd, func(o *Options) {
		o.EmbeddedEtcdDir, o.Etcd.Endpoints = "/tmp/etcd", []string{"http://10.0.0.1:2379"}
	}, "excludes etcd endpoints"},
	{"EmbeddedEtcdDir", validEtcd, func(o *Options) { o.EmbeddedEtcdDir = "" }, ""},
	{"EmbeddedEtcdClientURL", validEtcd, func(o *Options) {
		o.EmbeddedEtcdDir, o.EmbeddedEtcdClientURL = "/tmp/etcd", "http://127.0.0.1:12379"
	}, ""},
	{"EmbeddedEtcdClientURL", validEtcd, func(o *Options) {
		o.EmbeddedEtcdDir, o.EmbeddedEtcdClientURL = "/tmp/etcd", "ftp://127.0.0.1:12379"
	}, "scheme"},
	{"EmbeddedEtcdClientURL", validEtcd, func(o *Options) { o.EmbeddedEtcdDir = "/tmp/etcd" }, ""},
	{"EmbeddedEtcdTLS", validEtcd, func(o *Options) {
		o.EmbeddedEtcdDir, o.EmbeddedEtcdTLS = "/tmp/etcd", EmbeddedEtcdTLS{Cert: "c", Key: "k", ClientCA: "ca"}
		o.Etcd.Cert, o.Etcd.Key = "cc", "ck"
	}, ""},
	{"EmbeddedEtcdTLS", validEtcd, func(o *Options) { o.EmbeddedEtcdTLS = EmbeddedEtcdTLS{Cert: "c", Key: "k"} }, "needs --embedded-etcd"},
	{"EmbeddedEtcdTLS", validEtcd, func(o *Options) { o.EmbeddedEtcdDir, o.EmbeddedEtcdTLS = "/tmp/etcd", EmbeddedEtcdTLS{Cert: "c"} }, "--embedded-etcd-key"},
	{"EmbeddedEtcdTLS", validEtcd, func(o *Options) {
		o.EmbeddedEtcdDir, o.EmbeddedEtcdTLS = "/tmp/etcd", EmbeddedEtcdTLS{Cert: "c", Key: "k", ClientCA: "ca"}
	}, "--etcd-cert"},
	{"EmbeddedEtcdTLS", validEtcd, func(o *Options) { o.EmbeddedEtcdTLS = EmbeddedEtcdTLS{} }, ""},
	{"Membership.Layout", validEtcd, func(o *Options) { o.Membership.Layout.Prefix = "/pr/v1/" }, ""},
	{"Membership.Layout", validEtcd, func(o *Options) { o.Membership.Layout.Prefix = "" }, ""},
	{"Membership.TTL", validEtcd, func(o *Options) { o.Membership.TTL = 3 * time.Second }, ""},
	{"Membership.TTL", validEtcd, func(o *Options) { o.Membership.TTL = -time.Second }, "TTL"},
	{"Membership.TTL", validEtcd, func(o *Options) { o.Membership.TTL = 0 }, ""},
	{"Router.CacheSaltKey", validStatic, func(o *Options) { o.Router.CacheSaltKey = "0123456789abcdef" }, ""},
	{"Router.CacheSaltKey", validStatic, func(o *Options) { o.Router.CacheSaltKey = "short" }, "--cache-salt-key"},
	{"Router.CacheSaltKey", validStatic, func(o *Options) { o.Router.CacheSaltKey = "" }, ""},
	{"Router.StaleAfter", validStatic, func(o *Options) { o.Router.StaleAfter = time.Minute }, ""},
	{"Router.StaleAfter", validStatic, func(o *Options) { o.Router.StaleAfter = -time.Minute }, "StaleAfter"},
	{"Router.StaleAfter", validStatic, func(o *Options) { o.Router.StaleAfter = 0 }, ""},
	{"Limits.ReadHeaderTimeout", validStatic, func(o *Options) { o.Limits.ReadHeaderTimeout = time.Second }, ""},
	{"Limits.ReadHeaderTimeout", validStatic, func(o *Options) { o.Limits.ReadHeaderTimeout = -time.Second }, "--read-header-timeout"},
	{"Limits.ReadHeaderTimeout", validStatic, func(o *Options) { o.Limits.ReadHeaderTimeout = 0 }, ""},
	{"Limits.BodyReadTimeout", validStatic, func(o *Options) { o.Limits.BodyReadTimeout = time.Second }, ""},
	{"Limits.BodyReadTimeout", validStatic, func(o *Options) { o.Limits.BodyReadTimeout = -time.Second }, "--body-read-timeout"},
	{"Limits.BodyReadTimeout", validStatic, func(o *Options) { o.Limits.BodyReadTimeout = 0 }, ""},
	{"Limits.IdleTimeout", validStatic, func(o *Options) { o.Limits.IdleTimeout = time.Second }, ""},
	{"Limits.IdleTimeout", validStatic, func(o *Options) { o.Limits.IdleTimeout = -time.Second }, "--idle-timeout"},
	{"Limits.IdleTimeout", validStatic, func(o *Options) { o.Limits.IdleTimeout = 0 }, ""},
	{"Limits.MaxHeaderBytes", validStatic, func(o *Options) { o.Limits.MaxHeaderBytes = 1 << 14 }, ""},
	{"Limits.MaxHeaderBytes", validStatic, func(o *Options) { o.Limits.MaxHeaderBytes = -1 }, "--max-header-bytes"},
	{"Limits.MaxHeaderBytes", validStatic, func(o *Options) { o.Limits.MaxHeaderBytes = 0 }, ""},
	{"Limits.MaxHeaderCount", validStatic, func(o *Options) { o.Limits.MaxHeaderCount = 200 }, ""},
	{"Limits.MaxHeaderCount", validStatic, func(o *Options) { o.Limits.MaxHeaderCount = -1 }, "--max-header-count"},
	{"Limits.MaxHeaderCount", validStatic, func(o *Options) { o.Limits.MaxHeaderCount = 0 }, ""},
	{"Limits.MaxConns", validStatic, func(o *Options) { o.Limits.MaxConns = 100 }, ""},
	{"Limits.MaxConns", validStatic, func(o *Options) { o.Limits.MaxConns = -1 }, "--max-connections"},
	{"Limits.MaxConns", validStatic, func(o *Options) { o.Limits.MaxConns = 0 }, ""},
	{"Limits.WriteIdleTimeout", validStatic, func(o *Options) { o.Limits.WriteIdleTimeout = time.Second }, ""},
	{"Limits.WriteIdleTimeout", validStatic, func(o *Options) { o.Limits.WriteIdleTimeout = -time.Second }, "--write-idle-timeout"},
	{"Limits.WriteIdleTimeout", validStatic, func(o *Options) { o.Limits.WriteIdleTimeout = 0 }, ""},
	{"Limits.MaxStreamDuration", validStatic, func(o *Options) { o.Limits.MaxStreamDuration = time.Hour }, ""},
	{"Limits.MaxStreamDuration", validStatic, func(o *Options) { o.Limits.MaxStreamDuration = -time.Hour }, "--max-stream-duration"},
	{"Limits.MaxStreamDuration", validStatic, func(o *Options) { o.Limits.MaxStreamDuration = 0 }, ""},
	{"Admin.Token", validStatic, func(o *Options) { o.Admin.Token = "t" }, ""},
	{"Admin.Token", validStatic, func(o *Options) { o.Admin.Token = "" }, ""},
	{"Admin.OpenReads", validStatic, func(o *Options) { o.Admin.Token, o.Admin.OpenReads = "t", true }, ""},
	{"Admin.OpenReads", validStatic, func(o *Options) { o.Admin.OpenReads = true }, "--admin-open-reads"},
	{"Admin.OpenReads", validStatic, func(o *Options) { o.Admin.OpenReads = false }, ""},
	{"ExtProc.Token", validStatic, func(o *Options) { o.ExtProcListen, o.ExtProc.Token = "127.0.0.1:0", "t" }, ""},
	{"ExtProc.Token", validStatic, func(o *Options) { o.ExtProc.Token = "t" }, "--ext-proc-listen"},
	{"ExtProc.Token", validStatic, func(o *Options) { o.ExtProc.Token = "" }, ""},
	{"ExtProc.TLSCert", validStatic, func(o *Options) {
		o.ExtProcListen, o.ExtProc.TLSCert, o.ExtProc.TLSKey = "127.0.0.1:0", "c.pem", "k.pem"
	}, ""},
	{"ExtProc.TLSCert", validStatic, func(o *Options) { o.ExtProcListen, o.ExtProc.TLSCert = "127.0.0.1:0", "c.pem" }, "--ext-proc-tls-key"},
	{"ExtProc.TLSCert", validStatic, func(o *Options) { o.ExtProc.TLSCert = "" }, ""},
	{"ExtProc.TLSKey", validStatic, func(o *Options) { o.ExtProcListen, o.ExtProc.TLSKey = "127.0.0.1:0", "k.pem" }, "--ext-proc-tls-cert"},
	{"ExtProc.TLSKey", validStatic, func(o *Options) {
		o.ExtProcListen, o.ExtProc.TLSCert, o.ExtProc.TLSKey = "127.0.0.1:0", "c.pem", "k.pem"
	}, ""},
	{"ExtProc.TLSKey", validStatic, func(o *Options) { o.ExtProc.TLSKey = "" }, ""},
	{"ExtProc.ClientCA", validStatic, func(o *Options) { o.ExtProcListen, o.ExtProc.ClientCA = "127.0.0.1:0", "ca.pem" }, "--ext-proc-client-ca"},
	{"ExtProc.ClientCA", validStatic, func(o *Options) {
		o.ExtProcListen, o.ExtProc.TLSCert, o.ExtProc.TLSKey, o.ExtProc.ClientCA = "127.0.0.1:0", "c.pem", "k.pem", "ca.pem"
	}, ""},
	{"ExtProc.ClientCA", validStatic, func(o *Options) { o.ExtProc.ClientCA = "" }, ""},
	{"Router.BodyBufferBytes", validStatic, func(o *Options) { o.Router.BodyBufferBytes = 64 << 20 }, ""},
	{"Router.BodyBufferBytes", validStatic, func(o *Options) { o.Router.BodyBufferBytes = router.DefaultMaxBodyBytes }, "--body-buffer-bytes"},
	{"Router.BodyBufferBytes", validStatic, func(o *Options) { o.Router.MaxBodyBytes, o.Router.BodyBufferBytes = 1<<20, 2<<20 }, ""},
	{"Router.BodyBufferBytes", validStatic, func(o *Options) { o.Router.BodyBufferBytes = 0 }, ""},
	{"Router.BodyBufferWait", validStatic, func(o *Options) { o.Router.BodyBufferWait = time.Second }, ""},
	{"Router.BodyBufferWait", validStatic, func(o *Options) { o.Router.BodyBufferWait = -1 }, "--body-buffer-wait"},
	{"Router.BodyBufferWait", validStatic, func(o *Options) { o.Router.BodyBufferWait = 0 }, ""},
	{"Router.UpstreamIdleTimeout", validStatic, func(o *Options) { o.Router.UpstreamIdleTimeout = time.Minute }, ""},
	{"Router.UpstreamIdleTimeout", validStatic, func(o *Options) { o.Router.UpstreamIdleTimeout = -1 }, "--upstream-idle-timeout"},
	{"Router.UpstreamIdleTimeout", validStatic, func(o *Options) { o.Router.UpstreamIdleTimeout = 0 }, ""},
	{"Router.SessionKey", validStatic, func(o *Options) { o.Router.SessionKey = []byte("0123456789abcdef0123456789abcdef") }, ""},
	{"Router.SessionKey", validStatic, func(o *Options) { o.Router.SessionKey = []byte("short") }, "--session-key-file"},
	{"Router.SessionKey", validStatic, func(o *Options) { o.Router.SessionKey = nil }, ""},
	{"Admin.TLSCert", validStatic, func(o *Options) { o.Admin.TLSCert, o.Admin.TLSKey = "c.pem", "k.pem" }, ""},
	{"Admin.TLSCert", validStatic, func(o *Options) { o.Admin.TLSCert = "c.pem" }, "--admin-tls-key"},
	{"Admin.TLSCert", validStatic, func(o *Options) { o.Admin.TLSCert = "" }, ""},
	{"Admin.TLSKey", validStatic, func(o *Options) { o.Admin.TLSKey, o.Admin.TLSCert = "k.pem", "c.pem" }, ""},
	{"Admin.TLSKey", validStatic, func(o *Options) { o.Admin.TLSKey = "k.pem" }, "--admin-tls-cert"},
	{"Admin.TLSKey", validStatic, func(o *Options) { o.Admin.TLSKey = "" }, ""},
	{"Admin.ClientCA", validStatic, func(o *Options) { o.Admin.TLSCert, o.Admin.TLSKey, o.Admin.ClientCA = "c", "k", "ca" }, ""},
	{"Admin.ClientCA", validStatic, func(o *Options) { o.Admin.ClientCA = "ca.pem" }, "--admin-client-ca"},
	{"Admin.ClientCA", validStatic, func(o *Options) { o.Admin.ClientCA = "" }, ""},
	{"GCPercent", validStatic, func(o *Options) { o.GCPercent = DefaultGCPercent }, ""},
	{"GCPercent", validStatic, func(o *Options) { o.GCPercent = -1 }, ""},
	{"GCPercent", validStatic, func(o *Options) { o.GCPercent = -2 }, "--gc-percent"},
	{"GCPercent", validStatic, func(o *Options) { o.GCPercent = 0 }, ""},
	{"Pprof", validStatic, func(o *Options) { o.Pprof = true }, ""},
	{"Pprof", validStatic, func(o *Options) { o.Pprof = false }, ""},
	{"StartupTimeout", validStatic, func(o *Options) { o.StartupTimeout = time.Second }, ""},
	{"StartupTimeout", validStatic, func(o *Options) { o.StartupTimeout = -time.Second }, "--startup-timeout"},
	{"StartupTimeout", validStatic, func(o *Options) { o.StartupTimeout = 0 }, ""},
	{"PopularityInterval", validStatic, func(o *Options) { o.PopularityInterval = time.Second }, ""},
	{"PopularityInterval", validStatic, func(o *Options) { o.PopularityInterval = 10 * time.Millisecond }, "--popularity-interval"},
	{"PopularityInterval", validStatic, func(o *Options) { o.PopularityInterval = time.Hour }, "--popularity-interval"},
	{"PopularityInterval", validStatic, func(o *Options) { o.PopularityInterval = 0 }, ""},
	{"VanishGrace", validEtcd, func(o *Options) { o.VanishGrace = time.Minute }, ""},
	{"VanishGrace", validEtcd, func(o *Options) { o.VanishGrace = -time.Second }, "--vanish-grace"},
	{"VanishGrace", validEtcd, func(o *Options) { o.VanishGrace = 0 }, ""},
	{"RateInterval", validEtcd, func(o *Options) { o.RateInterval = 500 * time.Millisecond }, ""},
	{"RateInterval", validEtcd, func(o *Options) { o.RateInterval = -time.Second }, "--rate-interval"},
	{"RateInterval", validEtcd, func(o *Options) { o.RateInterval = 0 }, ""},
	{"DrainDelay", validStatic, func(o *Options) { o.DrainDelay = time.Second }, ""},
	{"DrainDelay", validStatic, func(o *Options) { o.DrainDelay = -time.Second }, "--drain-delay"},
	{"DrainDelay", validStatic, func(o *Options) { o.DrainDelay = 0 }, ""},
	{"ShutdownTimeout", validStatic, func(o *Options) { o.ShutdownTimeout = time.Second }, ""},
	{"ShutdownTimeout", validStatic, func(o *Options) { o.ShutdownTimeout = -time.Second }, "--shutdown-timeout"},
	{"ShutdownTimeout", validStatic, func(o *Options) { o.ShutdownTimeout = 0 }, ""},
	{"Router.DefaultEndpoint", validStatic, func(o *Options) { o.Router.DefaultEndpoint = "embed" }, ""},
	{"Router.DefaultEndpoint", validStatic, func(o *Options) { o.Router.DefaultEndpoint = "a b" }, "endpoint"},
	{"Router.DefaultEndpoint", validStatic, func(o *Options) { o.Router.DefaultEndpoint = "" }, "--endpoint"},
	{"Router.FirstByteTimeout", validStatic, func(o *Options) { o.Router.FirstByteTimeout = time.Minute }, ""},
	{"Router.FirstByteTimeout", validStatic, func(o *Options) { o.Router.FirstByteTimeout = -1 }, "--upstream-first-byte-timeout"},
	{"Router.FirstByteTimeout", validStatic, func(o *Options) { o.Router.FirstByteTimeout = 0 }, ""},
	{"Router.APIKeys", validStatic, func(o *Options) { o.Router.APIKeys = []string{"sha256:" + strings.Repeat("ab", 32)} }, ""},
	{"Router.APIKeys", validStatic, func(o *Options) { o.Router.APIKeys = []string{"sha256:abc"} }, "--api-keys-file"},
	{"Router.APIKeys", validStatic, func(o *Options) { o.Router.APIKeys = []string{"a-key-in-clear-not-a-digest"} }, "--api-keys-file"},
	{"Router.APIKeys", validStatic, func(o *Options) { o.Router.APIKeys = nil }, ""},
	{"Router.HideInstanceID", validStatic, func(o *Options) { o.Router.HideInstanceID = true }, ""},
	{"Router.HideInstanceID", validStatic, func(o *Options) { o.Router.HideInstanceID = false }, ""},
	{"Router.MaxBodyBytes", validStatic, func(o *Options) { o.Router.MaxBodyBytes = 1 << 20 }, ""},
	{"Router.MaxBodyBytes", validStatic, func(o *Options) { o.Router.MaxBodyBytes = -1 }, "--max-body-bytes"},
	{"Router.MaxBodyBytes", validStatic, func(o *Options) { o.Router.MaxBodyBytes = 0 }, ""},
	{"Router.HotKeyThreshold", validStatic, func(o *Options) { o.Router.HotKeyThreshold = 0.5 }, ""},
	{"Router.HotKeyThreshold", validStatic, func(o *Options) { o.Router.HotKeyThreshold = -1 }, "--hot-key-threshold"},
	{"Router.HotKeyThreshold", validStatic, func(o *Options) { o.Router.HotKeyThreshold = 20 }, "--hot-key-threshold"},
	{"Router.HotKeyThreshold", validStatic, func(o *Options) { o.Router.HotKeyThreshold = 0 }, ""},
	{"Router.BalanceFactor", validStatic, func(o *Options) { o.Router.BalanceFactor = 1.25 }, ""},
	{"Router.BalanceFactor", validStatic, func(o *Options) { o.Router.BalanceFactor = 0.5 }, "--balance-factor"},
	{"Router.BalanceFactor", validStatic, func(o *Options) { o.Router.BalanceFactor = 11 }, "--balance-factor"},
	{"Router.BalanceFactor", validStatic, func(o *Options) { o.Router.BalanceFactor = 0 }, ""},
	{"Router.UpstreamHeaderTimeout", validStatic, func(o *Options) { o.Router.UpstreamHeaderTimeout = time.Minute }, ""},
	{"Router.UpstreamHeaderTimeout", validStatic, func(o *Options) { o.Router.UpstreamHeaderTimeout = -1 }, "--upstream-header-timeout"},
	{"Router.UpstreamHeaderTimeout", validStatic, func(o *Options) { o.Router.UpstreamHeaderTimeout = 0 }, ""},
	{"Router.Breaker.ConsecutiveFailures", validStatic, func(o *Options) { o.Router.Breaker.ConsecutiveFailures = 3 }, ""},
	{"Router.Breaker.ConsecutiveFailures", validStatic, func(o *Options) { o.Router.Breaker.ConsecutiveFailures = 0 }, ""},
	{"Router.Breaker.OpenTimeout", validStatic, func(o *Options) { o.Router.Breaker.OpenTimeout = time.Second }, ""},
	{"Router.Breaker.OpenTimeout", validStatic, func(o *Options) { o.Router.Breaker.OpenTimeout = -time.Second }, "--breaker-open-timeout"},
	{"Router.Breaker.OpenTimeout", validStatic, func(o *Options) { o.Router.Breaker.OpenTimeout = 0 }, ""},
	{"Router.Breaker.HalfOpenMaxRequests", validStatic, func(o *Options) { o.Router.Breaker.HalfOpenMaxRequests = 2 }, ""},
	{"Router.Breaker.HalfOpenMaxRequests", validStatic, func(o *Options) { o.Router.Breaker.HalfOpenMaxRequests = 0 }, ""},
	{"Router.Breaker.ServerErrorKeys", validStatic, func(o *Options) { o.Router.Breaker.ServerErrorKeys = 1 }, ""},
	{"Router.Breaker.ServerErrorKeys", validStatic, func(o *Options) { o.Router.Breaker.ServerErrorKeys = -1 }, "ServerErrorKeys -1"},
	{"Router.Breaker.ServerErrorKeys", validStatic, func(o *Options) { o.Router.Breaker.ServerErrorKeys = 0 }, ""},
	{"Router.Breaker.ServerErrorWindow", validStatic, func(o *Options) { o.Router.Breaker.ServerErrorWindow = time.Minute }, ""},
	{"Router.Breaker.ServerErrorWindow", validStatic, func(o *Options) { o.Router.Breaker.ServerErrorWindow = -time.Second }, "ServerErrorWindow"},
	{"Router.Breaker.ServerErrorWindow", validStatic, func(o *Options) { o.Router.Breaker.ServerErrorWindow = 0 }, ""},
	{"Router.Breaker.MaxEjectionPercent", validStatic, func(o *Options) { o.Router.Breaker.MaxEjectionPercent = 100 }, ""},
	{"Router.Breaker.MaxEjectionPercent", validStatic, func(o *Options) { o.Router.Breaker.MaxEjectionPercent = 101 }, "--max-ejection-percent"},
	{"Router.Breaker.MaxEjectionPercent", validStatic, func(o *Options) { o.Router.Breaker.MaxEjectionPercent = 0 }, ""},
	{"Router.LoadPollInterval", validStatic, func(o *Options) { o.Router.LoadPollInterval = time.Second }, ""},
	{"Router.LoadPollInterval", validStatic, func(o *Options) { o.Router.LoadPollInterval = -time.Second }, "--load-poll-interval"},
	{"Router.LoadPollInterval", validStatic, func(o *Options) { o.Router.LoadPollInterval = 0 }, ""},
	{"Router.ThresholdShare", validStatic, func(o *Options) { o.Router.ThresholdShare = router.ShareReplicas }, ""},
	{"Router.ThresholdShare", validStatic, func(o *Options) { o.Router.ThresholdShare = "even" }, "--threshold-share"},
	{"Router.ThresholdShare", validStatic, func(o *Options) { o.Router.ThresholdShare = "" }, ""},
	{"Router.ReplicaID", validEtcd, func(o *Options) { o.Router.ReplicaID = "router-1" }, ""},
	{"Router.ReplicaID", validEtcd, func(o *Options) { o.Router.ReplicaID = "" }, ""},
	{"Router.LoadMetricsPath", validStatic, func(o *Options) { o.Router.LoadMetricsPath = "/metrics" }, ""},
	{"Router.LoadMetricsPath", validStatic, func(o *Options) { o.Router.LoadMetricsPath = "metrics" }, "LoadMetricsPath"},
	{"Router.LoadMetricsPath", validStatic, func(o *Options) { o.Router.LoadMetricsPath = "" }, ""},
	{"Router.HealthCheckInterval", validStatic, func(o *Options) { o.Router.HealthCheckInterval = time.Second }, ""},
	{"Router.HealthCheckInterval", validStatic, func(o *Options) { o.Router.HealthCheckInterval = -time.Second }, "--health-check-interval"},
	{"Router.HealthCheckInterval", validStatic, func(o *Options) { o.Router.HealthCheckInterval = 0 }, ""},
	{"Router.HealthCheckPath", validStatic, func(o *Options) { o.Router.HealthCheckPath = "/ping" }, ""},
	{"Router.HealthCheckPath", validStatic, func(o *Options) { o.Router.HealthCheckPath = "ping" }, "--health-check-path"},
	{"Router.HealthCheckPath", validStatic, func(o *Options) { o.Router.HealthCheckPath = "" }, ""},
	{"Router.AdapterWait", validStatic, func(o *Options) { o.Router.AdapterWait = time.Second }, ""},
	{"Router.AdapterWait", validStatic, func(o *Options) { o.Router.AdapterWait = 0 }, ""},
	{"Router.AdapterWait", validStatic, func(o *Options) { o.Router.AdapterWait = -time.Second }, "--adapter-wait"},
	{"Router.AdapterWaitQueue", validStatic, func(o *Options) { o.Router.AdapterWaitQueue = 10 }, ""},
	{"Router.AdapterWaitQueue", validStatic, func(o *Options) { o.Router.AdapterWaitQueue = 0 }, ""},
	{"Router.AdapterWaitQueue", validStatic, func(o *Options) { o.Router.AdapterWaitQueue = -1 }, "--adapter-wait-queue"},
	{"Router.HealthCheckTimeout", validStatic, func(o *Options) { o.Router.HealthCheckTimeout = time.Second }, ""},
	{"Router.HealthCheckTimeout", validStatic, func(o *Options) { o.Router.HealthCheckTimeout = -time.Second }, "--health-check-timeout"},
	{"Router.HealthCheckTimeout", validStatic, func(o *Options) { o.Router.HealthCheckTimeout = 0 }, ""},
}

func TestValidate(t *testing.T) {
	for _, tc := range validateCases {
		o := tc.base()
		tc.set(&o)
		err := o.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: Validate() = %v, want nil", tc.field, err)
		case tc.want != "" && err == nil:
			t.Errorf("%s: Validate() = nil, want an error mentioning %q", tc.field, tc.want)
		case tc.want != "" && !strings.Contains(err.Error(), tc.want):
			t.Errorf("%s: Validate() = %v, want it to mention %q", tc.field, err, tc.want)
		case tc.want != "" && !errors.Is(err, fleet.ErrInvalid):
			t.Errorf("%s: Validate() = %v does not wrap fleet.ErrInvalid (the CLI's exit 2)", tc.field, err)
		}
	}
}

// settings lists the paths of the settings in the tree (dependencies, which
// are pointers, funcs and interfaces, are not settings), descending into
// the routing config and the router's, the breaker's, the limits' and the
// admin port's options.
func settings(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		path := prefix + f.Name
		if f.Anonymous { // an embedded struct's fields are promoted: Admin.TLSCert
			out = append(out, settings(f.Type, prefix)...)
			continue
		}
		if f.Type == reflect.TypeFor[*fleet.PrefixAwareConfig]() {
			out = append(out, settings(f.Type.Elem(), path+".")...)
			continue
		}
		switch f.Type.Kind() {
		case reflect.Pointer, reflect.Func, reflect.Interface:
			continue
		}
		if f.Type == reflect.TypeFor[[]any]() || f.Name == "RingOptions" {
			continue
		}
		switch f.Type {
		case reflect.TypeFor[router.Options](), reflect.TypeFor[overload.BreakerOptions](), reflect.TypeFor[Limits](),
			reflect.TypeFor[AdminSecurity](), reflect.TypeFor[ExtProcSecurity](), reflect.TypeFor[fleet.RoutingConfig]():
			out = append(out, settings(f.Type, path+".")...)
		case reflect.TypeFor[membership.Options]():
			out = append(out, path+".Layout", path+".TTL")
		default:
			out = append(out, path)
		}
	}
	return out
}

// unranged are the settings that no value puts out of range: switches,
// free-form strings and counts of which any is valid. Every other setting
// needs a row that Validate rejects.
var unranged = map[string]bool{
	"Listen":                  true, // checked when listening
	"AdminListen":             true,
	"Membership.Layout":       true,
	"Admin.Token":             true,
	"ExtProc.Token":           true,
	"Pprof":                   true,
	"Router.HideInstanceID":   true,
	"Router.ReplicaID":        true, // replica.Start sets it to ID, the checked one
	"Routing.TenantCacheSalt": true,
	"Routing.PrefixAwareRoutingConfig.HotKeyReplication": true,
	"Routing.PrefixAwareRoutingConfig.FixedLengthKeys":   true,
	"Router.Breaker.ConsecutiveFailures":                 true, // uint32
	"Router.Breaker.HalfOpenMaxRequests":                 true,
}

// zeroAt reports whether the setting at path in o is zero (a nil pointer
// on the way counts as zero).
func zeroAt(o Options, path string) bool {
	v := reflect.ValueOf(o)
	for _, name := range strings.Split(path, ".") {
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return true
			}
			v = v.Elem()
		}
		v = v.FieldByName(name)
	}
	return v.IsZero()
}

// TestValidateCoversEverySetting fails when a setting of the tree lacks a
// row in validateCases that is in range (valid, not zero), one that is out
// of range (unless it is unranged) or one that is zero (the default): the
// field, its flag, its check, its test.
func TestValidateCoversEverySetting(t *testing.T) {
	type coverage struct{ inRange, outOfRange, zero bool }
	rows := map[string]*coverage{}
	for _, tc := range validateCases {
		c := rows[tc.field]
		if c == nil {
			c = &coverage{}
			rows[tc.field] = c
		}
		o := tc.base()
		tc.set(&o)
		zero := zeroAt(o, tc.field)
		c.zero = c.zero || zero
		c.inRange = c.inRange || (!zero && tc.want == "")
		c.outOfRange = c.outOfRange || tc.want != ""
	}
	for _, s := range settings(reflect.TypeFor[Options](), "") {
		c := rows[s]
		switch {
		case c == nil:
			t.Errorf("setting %s has no row in validateCases", s)
		case !c.inRange:
			t.Errorf("setting %s has no valid, non-zero row", s)
		case !c.zero:
			t.Errorf("setting %s has no row with its zero value (the default)", s)
		case !c.outOfRange && !unranged[s]:
			t.Errorf("setting %s has no row that Validate rejects (or add it to unranged)", s)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	o := validEtcd().withDefaults()
	if o.Listen != DefaultListen || o.AdminListen != DefaultAdminListen {
		t.Errorf("listen defaults: %q %q", o.Listen, o.AdminListen)
	}
	if o.StartupTimeout != DefaultStartupTimeout || o.ShutdownTimeout != DefaultShutdownTimeout {
		t.Errorf("duration defaults: %v %v", o.StartupTimeout, o.ShutdownTimeout)
	}
	if o.ID == "" {
		t.Error("an etcd replica needs an id; withDefaults left it empty")
	}
	if len(o.Etcd.Endpoints) != 1 || o.Etcd.Endpoints[0] != membership.DefaultClientURL {
		t.Errorf("etcd endpoints default: %v", o.Etcd.Endpoints)
	}
	if o.Logger == nil || o.Registry == nil || o.Router.Registry != o.Registry || o.Router.Logger != o.Logger || o.Membership.Logger != o.Logger {
		t.Error("dependencies are not shared down the tree")
	}
	e := Options{EmbeddedEtcdDir: "/tmp/x", Router: router.Options{DefaultEndpoint: "chat"}}.withDefaults()
	if e.EmbeddedEtcdClientURL != membership.DefaultClientURL || len(e.Etcd.Endpoints) != 1 || e.Etcd.Endpoints[0] != e.EmbeddedEtcdClientURL {
		t.Errorf("embedded etcd defaults: %q %v", e.EmbeddedEtcdClientURL, e.Etcd.Endpoints)
	}
	if err := e.Validate(); err != nil {
		t.Errorf("defaults of an embedded etcd must validate: %v", err)
	}
	s := validStatic().withDefaults()
	if s.ID != "" || len(s.Etcd.Endpoints) != 0 {
		t.Errorf("a static fleet gets no replica id (%q) and no etcd endpoints (%v)", s.ID, s.Etcd.Endpoints)
	}
}
