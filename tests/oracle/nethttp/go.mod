module gpugate/nethttp

go 1.26
