"""nvshare's Kubernetes device plugin: each GPU advertised to the kubelet as
several devices of one extended resource (docs/kubernetes.md)."""
