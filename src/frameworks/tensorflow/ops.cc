// krug's TensorFlow ops: their signatures and shape functions. The kernels are in kernels.cc;
// python/krug/tensorflow/mpi_ops.py wraps them with Horovod's API and registers gradients.
//
// Every collective takes `ignore_name_scope`: ranks match operations by name, and in a graph
// the name is the node's (unique in the graph, and equal on every rank that builds the same
// graph); a caller that builds the same op under different name scopes on different ranks
// strips the scopes. `process_set_id` is a registered process set (0: every rank).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// The dtypes krug reduces and moves (krug::DataType).
#define KRUG_TF_TYPES                                                                          \
  "{uint8, int8, int16, int32, int64, uint16, uint32, uint64, half, bfloat16, float, double, " \
  "bool}"

// Every output i has the shape of input i.
absl::Status same_shapes(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

// Every output i has the shape of input i, except that negotiation decides the first dimension
// (allgather, alltoall, reducescatter). Inputs must have at least one dimension.
absl::Status first_dimension_unknown(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) {
    ShapeHandle input;
    TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(i), 1, &input));
    ShapeHandle output;
    TF_RETURN_IF_ERROR(c->ReplaceDim(input, 0, c->UnknownDim(), &output));
    c->set_output(i, output);
  }
  return absl::OkStatus();
}

}  // namespace

REGISTER_OP("KrugAllreduce")
    .Attr("T: " KRUG_TF_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = false")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("sum: T")
    .SetShapeFn(same_shapes)
    .Doc("The reduction (reduce_op: krug::ReduceOp) of `tensor` over the process set's ranks.");

REGISTER_OP("KrugGroupedAllreduce")
    .Attr("T: list(" KRUG_TF_TYPES ")")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = false")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Output("sums: T")
    .SetShapeFn(same_shapes)
    .Doc("KrugAllreduce of every tensor, negotiated and run as one group.");

REGISTER_OP("KrugAllgather")
    .Attr("T: " KRUG_TF_TYPES)
    .Attr("ignore_name_scope: bool = false")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(first_dimension_unknown)
    .Doc("Every rank's `tensor` concatenated along the first dimension (which may differ).");

REGISTER_OP("KrugGroupedAllgather")
    .Attr("T: list(" KRUG_TF_TYPES ")")
    .Attr("ignore_name_scope: bool = false")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetShapeFn(first_dimension_unknown)
    .Doc("KrugAllgather of every tensor, negotiated and run as one group.");

REGISTER_OP("KrugBroadcast")
    .Attr("T: " KRUG_TF_TYPES)
    .Attr("root_rank: int")
    .Attr("ignore_name_scope: bool = false")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(same_shapes)
    .Doc("`tensor` of root_rank (its index within the process set) on every rank.");

REGISTER_OP("KrugAlltoall")
    .Attr("T: " KRUG_TF_TYPES)
    .Attr("ignore_name_scope: bool = false")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Input("splits: int32")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle input;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(0), 1, &input));
      ShapeHandle output;
      TF_RETURN_IF_ERROR(c->ReplaceDim(input, 0, c->UnknownDim(), &output));
      c->set_output(0, output);
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc(
        "Sends splits[r] rows to rank r (empty splits: an even split); received_splits[r] "
        "rows came from rank r.");

REGISTER_OP("KrugReducescatter")
    .Attr("T: " KRUG_TF_TYPES)
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = false")
    .Attr("process_set_id: int = 0")
    .Input("tensor: T")
    .Output("output: T")
    .SetShapeFn(first_dimension_unknown)
    .Doc("The reduction over the ranks; this rank keeps its share of the first dimension.");

REGISTER_OP("KrugGroupedReducescatter")
    .Attr("T: list(" KRUG_TF_TYPES ")")
    .Attr("reduce_op: int")
    .Attr("prescale_factor: float = 1.0")
    .Attr("postscale_factor: float = 1.0")
    .Attr("ignore_name_scope: bool = false")
    .Attr("process_set_id: int = 0")
    .Input("tensors: T")
    .Output("outputs: T")
    .SetShapeFn(first_dimension_unknown)
    .Doc("KrugReducescatter of every tensor, negotiated and run as one group.");

REGISTER_OP("KrugJoin")
    .Output("last_joined_rank: int32")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("For a rank out of data: returns once every rank joined, with the last one's rank.");

// Topology as ops, so that a graph reads it when it runs rather than when it was traced.
// Stateful: never constant-folded.
#define KRUG_TOPOLOGY_OP(op_name, doc)                      \
  REGISTER_OP(op_name)                                      \
      .Attr("process_set_id: int = 0")                      \
      .Output("value: int32")                               \
      .SetIsStateful()                                      \
      .SetShapeFn(tensorflow::shape_inference::ScalarShape) \
      .Doc(doc)

KRUG_TOPOLOGY_OP("KrugSize", "Ranks in the process set.");
KRUG_TOPOLOGY_OP("KrugRank", "This rank's index in the process set (-1: not a member).");
KRUG_TOPOLOGY_OP("KrugLocalSize", "Ranks on this host (process_set_id must be 0).");
KRUG_TOPOLOGY_OP("KrugLocalRank", "This rank's index on its host (process_set_id must be 0).");
KRUG_TOPOLOGY_OP("KrugProcessSetIncluded", "1 when this rank is in the process set, else 0.");
