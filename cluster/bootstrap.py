from accounts.bootstrap import bootstrap_step


@bootstrap_step(order=20)
def local_node(say) -> None:
    from cluster.services import register_local_node

    node = register_local_node()
    gpus = node.devices.count()
    say(f"Node '{node.name}' in the pool: {node.cpu_cores} cores, {node.memory_bytes / 2**30:.1f} GiB, {gpus} GPU(s)")
