module github.com/goverbs/rdma/examples/dns

go 1.26.0

replace github.com/goverbs/rdma => ../../

require (
	github.com/goverbs/rdma v0.0.0-00010101000000-000000000000
	github.com/miekg/dns v1.1.73
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
