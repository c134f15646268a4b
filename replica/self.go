package replica

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// selfListeners lists the addresses through which each of lns is reached
// (issue 19: an instance record must not point back at the router). A
// listener on one address is reached there and through the unspecified
// address (Linux connects 0.0.0.0 and :: to the local host); one on a
// wildcard also through every loopback address and every address of the
// host's interfaces.
func selfListeners(lns ...net.Listener) ([]fleet.Listener, error) {
	var out []fleet.Listener
	var ifaces []netip.Addr
	for _, ln := range lns {
		if ln == nil {
			continue
		}
		ta, ok := ln.Addr().(*net.TCPAddr)
		if !ok {
			continue
		}
		ap := ta.AddrPort()
		port := ap.Port()
		add := func(p netip.Prefix) { out = append(out, fleet.Listener{Prefix: p, Port: port}) }
		add(netip.PrefixFrom(netip.IPv4Unspecified(), 32))
		add(netip.PrefixFrom(netip.IPv6Unspecified(), 128))
		a := ap.Addr().Unmap()
		if !a.IsUnspecified() {
			add(netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		add(netip.MustParsePrefix("127.0.0.0/8"))
		add(netip.PrefixFrom(netip.IPv6Loopback(), 128))
		if ifaces == nil {
			addrs, err := net.InterfaceAddrs()
			if err != nil {
				return nil, fmt.Errorf("replica: listing the host's addresses (to refuse records that point at this router): %w", err)
			}
			for _, ia := range addrs {
				if pn, ok := ia.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(pn.IP); ok {
						ifaces = append(ifaces, ip.Unmap())
					}
				}
			}
		}
		for _, ip := range ifaces {
			add(netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	return out, nil
}
