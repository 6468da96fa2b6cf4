"""A cluster on one machine, for tests, benchmarks and ``netplugin demo --nodes N``.

* :mod:`.apiserver` a small Kubernetes API server (Nodes and Pods: GET, LIST, WATCH);
* :mod:`.nsexec`    network namespace plumbing (``ip`` commands, a socket inside a netns);
* :mod:`.cluster`   :class:`~.cluster.SimCluster`: nodes as namespaces on a shared underlay,
  each with its own ``netplugin serve``.
"""
