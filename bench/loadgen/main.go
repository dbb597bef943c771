// Command loadgen sends signed webhook deliveries to one URL over keep-alive connections and
// prints one JSON line: requests, non-2xx answers, requests/second, and latency percentiles.
//
// Every request is freshly signed with the Standard Webhooks scheme (HMAC-SHA256 over
// "id.timestamp.body", base64) and carries a fresh webhook-id and event id. The secret comes
// from the LOADGEN_SECRET environment variable, never the command line.
//
// Closed loop (default): each of -clients connections sends its next request as soon as the
// previous answer arrived, for -duration. Open loop (-rate R): the clients share a schedule of
// R requests/second, and a latency is measured from when its request was due, so a slow answer
// that delays the next request counts against that one too (no coordinated omission).
//
//	LOADGEN_SECRET=whsec_... loadgen -url http://127.0.0.1:8080/webhooks -clients 16 -duration 5s [-rate 1000]
package main

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

type result struct {
	latencies []time.Duration
	statuses  map[int]int
	errors    int
	ok        int // 2xx answers, warm-up included
}

func key(secret string) ([]byte, error) {
	if strings.HasPrefix(secret, "whsec_") {
		return base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	}
	return []byte(secret), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func main() {
	url := flag.String("url", "", "where to POST (http://127.0.0.1:PORT/webhooks)")
	clients := flag.Int("clients", 16, "concurrent keep-alive connections")
	duration := flag.Duration("duration", 5*time.Second, "how long to send (after -warmup)")
	warmup := flag.Duration("warmup", time.Second, "how long to send before measuring")
	rate := flag.Float64("rate", 0, "total requests/second shared by the clients (0: as fast as answered)")
	sessions := flag.Int("sessions", 500, "distinct session ids cycled through")
	flag.Parse()
	secret := os.Getenv("LOADGEN_SECRET")
	if *url == "" || secret == "" {
		fmt.Fprintln(os.Stderr, "loadgen: -url and $LOADGEN_SECRET are required")
		os.Exit(2)
	}
	hmacKey, err := key(secret)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen: the secret is not valid base64 after whsec_")
		os.Exit(2)
	}
	run := randomHex(4)
	start := time.Now().Add(*warmup)
	end := start.Add(*duration)
	results := make([]result, *clients)
	var wg sync.WaitGroup
	for c := 0; c < *clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			results[c] = client(c, *clients, *url, hmacKey, run, *sessions, *rate, start, end)
		}(c)
	}
	wg.Wait()

	var all []time.Duration
	statuses := map[string]int{}
	errors, bad, ok := 0, 0, 0
	for _, r := range results {
		all = append(all, r.latencies...)
		errors += r.errors
		ok += r.ok
		for code, n := range r.statuses {
			statuses[strconv.Itoa(code)] += n
			if code < 200 || code > 299 {
				bad += n
			}
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		i := int(p * float64(len(all)-1))
		return float64(all[i].Microseconds()) / 1000
	}
	out := map[string]any{
		"clients": *clients, "rate": *rate, "seconds": duration.Seconds(),
		"requests": len(all), "rps": float64(len(all)) / duration.Seconds(),
		"non_2xx": bad, "errors": errors, "statuses": statuses, "all_2xx": ok,
		"p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": pct(1.0),
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
}

func client(c, clients int, url string, hmacKey []byte, run string, sessions int, rate float64, start, end time.Time) result {
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        1,
		MaxIdleConnsPerHost: 1,
		MaxConnsPerHost:     1,
		DisableCompression:  true,
	}
	httpClient := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	defer transport.CloseIdleConnections()
	r := result{statuses: map[int]int{}}
	var interval time.Duration
	due := time.Now()
	if rate > 0 {
		interval = time.Duration(float64(time.Second) * float64(clients) / rate)
		due = due.Add(time.Duration(float64(interval) * float64(c) / float64(clients))) // spread the clients
	}
	var body bytes.Buffer
	for n := 0; ; n++ {
		if rate > 0 {
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
			}
		} else {
			due = time.Now()
		}
		if due.After(end) {
			return r
		}
		webhookID := fmt.Sprintf("wh_%s_%d_%d", run, c, n)
		session := fmt.Sprintf("sess_bench_%d", (c*7919+n)%sessions)
		now := time.Now().Unix()
		body.Reset()
		fmt.Fprintf(&body, `{"id":"evt_%s_%d_%d","object":"event","created_at":%d,"type":"agent.session.action_required",`+
			`"data":{"id":"%s","required_action":{"type":"environment_connection"}}}`, run, c, n, now, session)
		timestamp := strconv.FormatInt(now, 10)
		mac := hmac.New(sha256.New, hmacKey)
		mac.Write([]byte(webhookID + "." + timestamp + "."))
		mac.Write(body.Bytes())
		signature := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
		request, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body.Bytes()))
		if err != nil {
			panic(err)
		}
		request.Header.Set("content-type", "application/json")
		request.Header.Set("webhook-id", webhookID)
		request.Header.Set("webhook-timestamp", timestamp)
		request.Header.Set("webhook-signature", signature)
		response, err := httpClient.Do(request)
		finished := time.Now()
		measured := !due.Before(start)
		if err != nil {
			if measured {
				r.errors++
			}
		} else {
			io.Copy(io.Discard, response.Body)
			response.Body.Close()
			if response.StatusCode >= 200 && response.StatusCode <= 299 {
				r.ok++
			}
			if measured {
				r.statuses[response.StatusCode]++
				r.latencies = append(r.latencies, finished.Sub(due))
			}
		}
		if rate > 0 {
			due = due.Add(interval)
		}
	}
}
