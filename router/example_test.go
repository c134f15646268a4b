package router_test

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prefixrouter/prefixrouter/fleet"
	"github.com/prefixrouter/prefixrouter/router"
)

func Example() {
	insts, err := fleet.ParseStaticInstances("i-1=http://127.0.0.1:8001,i-2=http://127.0.0.1:8002")
	if err != nil {
		panic(err)
	}
	r, err := router.New(router.Options{DefaultEndpoint: "chat"})
	if err != nil {
		panic(err)
	}
	defer r.Close()
	r.Update(fleet.NewSnapshot([]fleet.Endpoint{{Name: "chat", Instances: insts}}, 0, 1, time.Now()))
	// r is the http.Handler to serve; Choose tells where a request would go.
	req, _ := http.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	id, err := r.Choose("chat", req)
	fmt.Println(err == nil, id == "i-1" || id == "i-2", r.Ready() == nil)
	// Output: true true true
}
