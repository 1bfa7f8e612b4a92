// mxoid's fused metric operator: the per-row values of accuracy and cross-entropy.
//
// mxoid_metric_rows(pred, label, columns="accuracy,cross_entropy") -> (rows, columns)
// float64, from float32 scores pred (rows, classes) and float32 labels (rows,). It
// computes, in one operator, what mxoid's metric head otherwise computes with a dozen
// MXNet operators (see mxoid/metrics/head.py), with the same arithmetic, so that the
// values are bit for bit the same:
//
// - accuracy: 1 where argmax(pred, axis=1) equals fix(label), else 0; the argmax is
//   MXNet's (mshadow's reduce_with_axis with red::maximum: the first largest score; a
//   NaN stops the search at the NaN), compared as a float32 index with the label
//   truncated toward zero (a NaN label never hits).
// - cross_entropy: -log(pick(pred, label) + 1e-12) in float32, as pick (mode 'clip':
//   the label cast to an index, then clipped to the classes), _plus_scalar, log and
//   negative compute it, then widened to float64.
//
// Built by mxoid/metrics/native/__init__.py against the lib_api.h that the installed
// MXNet ships, and loaded with mx.library.load.

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "mxnet/lib_api.h"

using namespace mxnet::ext;

typedef std::unordered_map<std::string, std::string> Attrs;

enum Column { kAccuracy = 0, kCrossEntropy = 1 };

static bool ParseColumns(const Attrs& attrs, std::vector<Column>* columns) {
  auto found = attrs.find("columns");
  if (found == attrs.end()) return false;
  std::stringstream text(found->second);
  std::string name;
  while (std::getline(text, name, ',')) {
    if (name == "accuracy") {
      columns->push_back(kAccuracy);
    } else if (name == "cross_entropy") {
      columns->push_back(kCrossEntropy);
    } else {
      return false;
    }
  }
  return !columns->empty();
}

MXReturnValue ParseAttrs(const Attrs& attrs, int* num_in, int* num_out) {
  std::vector<Column> columns;
  if (!ParseColumns(attrs, &columns)) {
    MX_ERROR_MSG << "mxoid_metric_rows: 'columns' must list accuracy and/or cross_entropy";
    return MX_FAIL;
  }
  *num_in = 2;
  *num_out = 1;
  return MX_SUCCESS;
}

MXReturnValue InferType(const Attrs& attrs, std::vector<int>* in_types,
                        std::vector<int>* out_types) {
  if (in_types->at(0) != kFloat32 || in_types->at(1) != kFloat32) {
    MX_ERROR_MSG << "mxoid_metric_rows takes float32 scores and labels";
    return MX_FAIL;
  }
  out_types->at(0) = kFloat64;
  return MX_SUCCESS;
}

MXReturnValue InferShape(const Attrs& attrs, std::vector<std::vector<unsigned int>>* in_shapes,
                         std::vector<std::vector<unsigned int>>* out_shapes) {
  const std::vector<unsigned int>& pred = in_shapes->at(0);
  const std::vector<unsigned int>& label = in_shapes->at(1);
  if (pred.size() != 2 || pred[1] == 0 || label.size() != 1 || label[0] != pred[0]) {
    MX_ERROR_MSG << "mxoid_metric_rows takes scores (rows, classes) and labels (rows,)";
    return MX_FAIL;
  }
  std::vector<Column> columns;
  ParseColumns(attrs, &columns);
  out_shapes->at(0) = {pred[0], static_cast<unsigned int>(columns.size())};
  return MX_SUCCESS;
}

// The index of mshadow's reduce_with_axis<red::maximum, true> along one row.
static float ArgMax(const float* row, int64_t classes) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t index = 0;
  for (int64_t k = 0; k < classes; ++k) {
    float before = best;
    if (!std::isnan(best) && !(best >= row[k])) best = row[k];
    if (before != best && !std::isnan(before)) index = k;
  }
  return static_cast<float>(static_cast<int>(index));
}

// pick(row, label, mode='clip'), as MXNet's pick kernel indexes: index_t is int32_t in
// MXNet 1.x builds without large-tensor support, as the pip wheels are.
static float Pick(const float* row, int64_t classes, float label) {
  int64_t j = static_cast<int32_t>(label);
  if (j <= 0) {
    j = 0;
  } else if (j >= classes) {
    j = classes - 1;
  }
  return row[j];
}

MXReturnValue Forward(const Attrs& attrs, std::vector<MXTensor>* inputs,
                      std::vector<MXTensor>* outputs, const OpResource& res) {
  std::vector<Column> columns;
  ParseColumns(attrs, &columns);
  const float* pred = inputs->at(0).data<float>();
  const float* label = inputs->at(1).data<float>();
  const int64_t rows = inputs->at(0).shape[0];
  const int64_t classes = inputs->at(0).shape[1];
  const size_t width = columns.size();
  double* out = outputs->at(0).data<double>();
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = pred + i * classes;
    for (size_t c = 0; c < width; ++c) {
      double value;
      if (columns[c] == kAccuracy) {
        value = ArgMax(row, classes) == std::trunc(label[i]) ? 1.0 : 0.0;
      } else {
        const float eps = static_cast<float>(1e-12);
        value = static_cast<double>(-std::log(Pick(row, classes, label[i]) + eps));
      }
      out[i * width + c] = value;
    }
  }
  return MX_SUCCESS;
}

REGISTER_OP(mxoid_metric_rows)
    .setParseAttrs(ParseAttrs)
    .setInferType(InferType)
    .setInferShape(InferShape)
    .setForward(Forward, "cpu");

MXReturnValue initialize(int version) { return MX_SUCCESS; }
