//go:build tools

// Package tools pins the kube-apiserver main package so that go.mod/go.sum
// cover everything `go build k8s.io/kubernetes/cmd/kube-apiserver` needs.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
