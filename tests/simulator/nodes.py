"""Nodes of hand-made iteration graphs, for replays worked out on paper."""

from ddlsim.data.graph.format import GraphNode, Phase


def compute_node(
    node_id: int, phase: Phase, module: str, forward_id: int | None = None
) -> GraphNode:
    """A matmul of ``module`` (its costs come from the test's durations)."""
    return GraphNode(
        id=node_id,
        kind="compute",
        phase=phase,
        op="aten.mm.default",
        module=module,
        forward_id=forward_id,
    )


def update_node(node_id: int, param: str, bucket: int | None = None) -> GraphNode:
    """AdamW's update of ``param``, in the module that owns it."""
    return GraphNode(
        id=node_id,
        kind="optimizer",
        phase="optimizer",
        op="optimizer.adamw",
        module=param.rsplit(".", maxsplit=1)[0],
        param=param,
        params=(param,),
        bucket=bucket,
    )


def collective_node(
    node_id: int, op: str, bucket: int, params: tuple[str, ...], grad_bytes: int
) -> GraphNode:
    """Bucket ``bucket``'s collective ``op`` over the gradients of ``params``."""
    return GraphNode(
        id=node_id,
        kind="comm",
        phase="comm",
        op=op,
        module="",
        params=params,
        grad_bytes=grad_bytes,
        bucket=bucket,
    )
