module gpugate/oracle

go 1.26
