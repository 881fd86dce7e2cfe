#include "observe/bayesian_optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "krug/types.h"

namespace krug::observe {
namespace {

constexpr double kPi = 3.14159265358979323846;

double squared_distance(const Point& a, const Point& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (a[i] - b[i]) * (a[i] - b[i]);
  return d;
}

std::vector<bool> categorical(const std::vector<int>& levels) {
  std::vector<bool> c;
  for (int l : levels) c.push_back(l > 0);
  return c;
}

}  // namespace

double GaussianProcess::kernel(const Point& a, const Point& b) const {
  double distance = 0, factor = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (i < categorical_.size() && categorical_[i]) {
      if (a[i] != b[i]) factor *= level_correlation_;
    } else {
      distance += (a[i] - b[i]) * (a[i] - b[i]);
    }
  }
  // Matern 5/2: smooth enough for throughput surfaces, less overconfident than the squared
  // exponential between samples.
  const double r = std::sqrt(5.0 * distance) / length_scale_;
  return factor * (1.0 + r + r * r / 3.0) * std::exp(-r);
}

double GaussianProcess::factorize() {
  const size_t n = x_.size();
  chol_.assign(n * n, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j <= i; ++j) {
      double sum = kernel(x_[i], x_[j]) + (i == j ? noise_ + 1e-9 : 0.0);
      for (size_t k = 0; k < j; ++k) sum -= chol_[i * n + k] * chol_[j * n + k];
      chol_[i * n + j] = i == j ? std::sqrt(std::max(sum, 1e-12)) : sum / chol_[j * n + j];
    }
  // alpha = L^-T L^-1 y
  std::vector<double> z(n);
  for (size_t i = 0; i < n; ++i) {
    double sum = y_[i];
    for (size_t k = 0; k < i; ++k) sum -= chol_[i * n + k] * z[k];
    z[i] = sum / chol_[i * n + i];
  }
  alpha_.assign(n, 0.0);
  for (size_t i = n; i-- > 0;) {
    double sum = z[i];
    for (size_t k = i + 1; k < n; ++k) sum -= chol_[k * n + i] * alpha_[k];
    alpha_[i] = sum / chol_[i * n + i];
  }
  double log_det = 0;
  for (size_t i = 0; i < n; ++i) log_det += std::log(chol_[i * n + i]);
  double fit = 0;
  for (size_t i = 0; i < n; ++i) fit += y_[i] * alpha_[i];
  return -0.5 * fit - log_det - 0.5 * static_cast<double>(n) * std::log(2 * kPi);
}

void GaussianProcess::fit(const std::vector<Point>& x, const std::vector<double>& y) {
  if (x.size() != y.size() || x.empty())
    throw Error("GaussianProcess::fit needs as many outputs as inputs, at least one");
  x_ = x;
  y_mean_ = std::accumulate(y.begin(), y.end(), 0.0) / static_cast<double>(y.size());
  double var = 0;
  for (double v : y) var += (v - y_mean_) * (v - y_mean_);
  y_scale_ = y.size() > 1 ? std::sqrt(var / static_cast<double>(y.size() - 1)) : 1.0;
  if (!(y_scale_ > 0)) y_scale_ = 1.0;
  y_.resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) y_[i] = (y[i] - y_mean_) / y_scale_;
  const bool any_categorical =
      std::find(categorical_.begin(), categorical_.end(), true) != categorical_.end();
  const std::vector<double> correlations =
      any_categorical ? std::vector<double>{0.1, 0.5, 0.8, 0.95} : std::vector<double>{1.0};
  double best_likelihood = -std::numeric_limits<double>::infinity();
  double best_scale = length_scale_, best_correlation = 1.0;
  for (double scale : {0.08, 0.15, 0.25, 0.4, 0.7, 1.2})
    for (double correlation : correlations) {
      length_scale_ = scale;
      level_correlation_ = correlation;
      if (const double likelihood = factorize(); likelihood > best_likelihood)
        best_likelihood = likelihood, best_scale = scale, best_correlation = correlation;
    }
  length_scale_ = best_scale;
  level_correlation_ = best_correlation;
  factorize();
}

GaussianProcess::Prediction GaussianProcess::predict(const Point& x) const {
  const size_t n = x_.size();
  std::vector<double> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = kernel(x, x_[i]);
  double mean = 0;
  for (size_t i = 0; i < n; ++i) mean += k[i] * alpha_[i];
  // variance = k(x,x) - v.v with L v = k
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    double sum = k[i];
    for (size_t j = 0; j < i; ++j) sum -= chol_[i * n + j] * v[j];
    v[i] = sum / chol_[i * n + i];
  }
  double variance = 1.0;
  for (double e : v) variance -= e * e;
  variance = std::max(variance, 1e-12);
  return {y_mean_ + y_scale_ * mean, variance * y_scale_ * y_scale_};
}

double expected_improvement(double mean, double variance, double best, double xi) {
  const double sd = std::sqrt(std::max(variance, 0.0));
  const double gain = mean - best - xi;
  if (sd < 1e-12) return std::max(gain, 0.0);
  const double z = gain / sd;
  const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * kPi);
  return std::max(gain * cdf + sd * pdf, 0.0);
}

BayesianOptimizer::BayesianOptimizer(int dimensions, double noise, uint64_t seed, int initial)
    : BayesianOptimizer(std::vector<int>(static_cast<size_t>(std::max(dimensions, 0)), 0), noise,
                        seed, initial) {}

BayesianOptimizer::BayesianOptimizer(std::vector<int> levels, double noise, uint64_t seed,
                                     int initial)
    : dimensions_(static_cast<int>(levels.size())),
      levels_(std::move(levels)),
      initial_(std::max(1, initial)),
      gp_(noise, categorical(levels_)),
      rng_(seed) {
  if (dimensions_ < 1) throw Error("BayesianOptimizer needs at least one dimension");
  if (!(noise > 0)) throw Error("BayesianOptimizer: the noise variance must be positive");
  size_t combinations = 1;
  for (int l : levels_) {
    if (l < 0 || l == 1)
      throw Error(
          fmt::format("BayesianOptimizer: a dimension has {} levels; use 0 for a "
                      "continuous one or at least 2 for a discrete one",
                      l));
    combinations *= static_cast<size_t>(std::max(l, 1));
    // Each combination gets its own search in next(): keep that a handful.
    if (combinations > 64)
      throw Error("BayesianOptimizer: more than 64 combinations of discrete levels");
  }
}

Point BayesianOptimizer::random_point() {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Point p(dimensions_);
  for (double& v : p) v = u(rng_);
  // One draw per coordinate whatever its kind, so a discrete level is as likely as any other.
  for (int d = 0; d < dimensions_; ++d)
    if (const int l = levels_[d]; l > 0)
      p[d] = static_cast<double>(std::min(l - 1, static_cast<int>(p[d] * l))) / (l - 1);
  return p;
}

Point BayesianOptimizer::snapped(Point x) const {
  for (int d = 0; d < dimensions_; ++d)
    if (const int l = levels_[d]; l > 0) x[d] = std::round(x[d] * (l - 1)) / (l - 1);
  return x;
}

std::vector<Point> BayesianOptimizer::discrete_combinations() const {
  std::vector<Point> combinations{Point(dimensions_, 0.0)};
  for (int d = 0; d < dimensions_; ++d) {
    if (levels_[d] == 0) continue;
    std::vector<Point> grown;
    for (const auto& c : combinations)
      for (int l = 0; l < levels_[d]; ++l) {
        Point p = c;
        p[d] = static_cast<double>(l) / (levels_[d] - 1);
        grown.push_back(std::move(p));
      }
    combinations = std::move(grown);
  }
  return combinations;
}

void BayesianOptimizer::add_sample(Point x, double y) {
  if (static_cast<int>(x.size()) != dimensions_)
    throw Error(fmt::format("BayesianOptimizer::add_sample: a point of {} coordinates, expected {}",
                            x.size(), dimensions_));
  for (double v : x)
    if (!(v >= 0.0 && v <= 1.0))
      throw Error(fmt::format("BayesianOptimizer::add_sample: coordinate {} outside [0,1]", v));
  if (!std::isfinite(y)) throw Error("BayesianOptimizer::add_sample: the score is not finite");
  x_.push_back(snapped(std::move(x)));
  y_.push_back(y);
}

std::pair<Point, double> BayesianOptimizer::maximize_expected_improvement(const Point& fixed,
                                                                          double best) {
  const double xi = 0.01 * std::abs(best);
  auto score = [&](const Point& p) {
    const auto prediction = gp_.predict(p);
    return expected_improvement(prediction.mean, prediction.variance, best, xi);
  };
  auto candidate = [&] {
    Point p = random_point();
    for (int d = 0; d < dimensions_; ++d)
      if (levels_[d] > 0) p[d] = fixed[d];
    return p;
  };
  Point chosen = candidate();
  double top = score(chosen);
  if (std::all_of(levels_.begin(), levels_.end(), [](int l) { return l > 0; }))
    return {chosen, top};
  // Dense random candidates find the right basin; the box is at most 3-D, so 1000 are plenty.
  for (int c = 0; c < 1000; ++c) {
    Point p = candidate();
    if (double s = score(p); s > top) top = s, chosen = p;
  }
  // Local refinement of the continuous coordinates around the best candidate.
  std::normal_distribution<double> step(0.0, 0.05);
  for (int c = 0; c < 200; ++c) {
    Point p = chosen;
    for (int d = 0; d < dimensions_; ++d)
      if (levels_[d] == 0) p[d] = std::clamp(p[d] + step(rng_), 0.0, 1.0);
    if (double s = score(p); s > top) top = s, chosen = p;
  }
  return {chosen, top};
}

Point BayesianOptimizer::next() {
  if (static_cast<int>(x_.size()) < initial_) {
    // Space filling: the best of a few random candidates by distance to what was sampled.
    Point chosen;
    double farthest = -1;
    for (int c = 0; c < 32; ++c) {
      Point p = random_point();
      double nearest = std::numeric_limits<double>::infinity();
      for (const auto& s : x_) nearest = std::min(nearest, squared_distance(p, s));
      if (nearest > farthest) farthest = nearest, chosen = p;
    }
    return chosen;
  }
  gp_.fit(x_, y_);
  double best = -std::numeric_limits<double>::infinity();
  for (const auto& s : x_) best = std::max(best, gp_.predict(s).mean);
  // Expected improvement for each value of the discrete dimensions, keeping the largest: the
  // continuous search cannot move between levels.
  Point chosen;
  double top = -1;
  for (const auto& fixed : discrete_combinations())
    if (auto [p, s] = maximize_expected_improvement(fixed, best); s > top) top = s, chosen = p;
  return chosen;
}

Point BayesianOptimizer::best() const {
  if (x_.empty()) throw Error("BayesianOptimizer::best before any sample");
  if (x_.size() < 2) return x_.front();
  GaussianProcess gp = gp_;
  gp.fit(x_, y_);
  size_t top = 0;
  double top_mean = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < x_.size(); ++i)
    if (double m = gp.predict(x_[i]).mean; m > top_mean) top_mean = m, top = i;
  return x_[top];
}

}  // namespace krug::observe
