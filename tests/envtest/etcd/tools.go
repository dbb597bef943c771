//go:build tools

// Package tools pins the etcd main package (the root of the
// go.etcd.io/etcd/server/v3 module is `package main` calling etcdmain.Main).
package tools

import _ "go.etcd.io/etcd/server/v3"
