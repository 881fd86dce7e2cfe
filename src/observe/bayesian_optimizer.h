// Bayesian optimization over a box: a Gaussian-process surrogate of a noisy objective and the
// expected-improvement rule for where to sample next. Maximizes.
//
// Inputs are points of [0,1]^d (callers map their parameters, e.g. on a log scale); outputs are
// standardized before fitting. A dimension may be discrete (e.g. on/off): it then takes evenly
// spaced levels in [0,1] and expected improvement is maximized for each level separately. The
// dimension and the number of samples are small (d <= 3, tens of samples), so the dense linear
// algebra (a Cholesky factorization) is written here instead of taking a linear-algebra dependency.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace krug::observe {

using Point = std::vector<double>;

class GaussianProcess {
 public:
  // `noise`: observation noise variance relative to the (standardized) signal variance of 1.
  // `categorical[i]`: dimension i is discrete (levels are compared equal or not, not by
  // distance); empty when all are continuous.
  explicit GaussianProcess(double noise, std::vector<bool> categorical = {})
      : noise_(noise), categorical_(std::move(categorical)) {}

  // Fits to samples (x in [0,1]^d). The length scale (and, with discrete dimensions, the
  // correlation between different levels) are the ones of a small grid that maximize the
  // marginal likelihood, so smooth and rough objectives both fit.
  void fit(const std::vector<Point>& x, const std::vector<double>& y);
  // Posterior mean and variance of the objective at x, in the units of y.
  struct Prediction {
    double mean;
    double variance;
  };
  Prediction predict(const Point& x) const;
  double length_scale() const { return length_scale_; }
  double level_correlation() const { return level_correlation_; }

 private:
  double kernel(const Point& a, const Point& b) const;
  // Factorizes K + noise*I for the current length scale; returns the log marginal likelihood.
  double factorize();

  double noise_;
  std::vector<bool> categorical_;
  double length_scale_ = 0.3;
  // The kernel's factor for each discrete coordinate that differs: near 1 when the levels shift
  // the surface without changing its shape, near 0 when they are unrelated.
  double level_correlation_ = 1.0;
  std::vector<Point> x_;
  std::vector<double> y_;  // standardized
  double y_mean_ = 0, y_scale_ = 1;
  std::vector<double> chol_;   // lower triangle, row-major n x n
  std::vector<double> alpha_;  // (K + noise I)^-1 y
};

// Expected improvement over `best` of a normal N(mean, variance), with exploration margin xi.
double expected_improvement(double mean, double variance, double best, double xi);

class BayesianOptimizer {
 public:
  // `initial`: how many space-filling points come before the surrogate is trusted.
  BayesianOptimizer(int dimensions, double noise, uint64_t seed, int initial = 3);
  // `levels[i]`: 0 for a continuous dimension, n >= 2 for one that takes the n values
  // 0, 1/(n-1), ..., 1 (2 for on/off).
  BayesianOptimizer(std::vector<int> levels, double noise, uint64_t seed, int initial = 3);

  // x in [0,1]^d; a discrete coordinate is rounded to its nearest level.
  void add_sample(Point x, double y);
  // The next point to sample: space-filling first, then the maximum of expected improvement.
  Point next();
  // The sampled point with the highest posterior mean (robust to one lucky noisy sample).
  Point best() const;
  size_t samples() const { return x_.size(); }

 private:
  Point random_point();
  Point snapped(Point x) const;
  // Every combination of the discrete dimensions' levels (continuous coordinates 0); a single
  // point when there are no discrete dimensions.
  std::vector<Point> discrete_combinations() const;
  // The point of highest expected improvement with the discrete coordinates fixed to `fixed`.
  std::pair<Point, double> maximize_expected_improvement(const Point& fixed, double best);

  int dimensions_;
  std::vector<int> levels_;
  int initial_;
  GaussianProcess gp_;
  std::mt19937_64 rng_;
  std::vector<Point> x_;
  std::vector<double> y_;
};

}  // namespace krug::observe
