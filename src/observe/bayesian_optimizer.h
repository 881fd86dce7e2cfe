// Bayesian optimization over a box: a Gaussian-process surrogate of a noisy objective and the
// expected-improvement rule for where to sample next. Maximizes.
//
// Inputs are points of [0,1]^d (callers map their parameters, e.g. on a log scale); outputs are
// standardized before fitting. The dimension and the number of samples are small (d <= 3,
// tens of samples), so the dense linear algebra (a Cholesky factorization) is written here
// instead of taking a linear-algebra dependency.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace krug::observe {

using Point = std::vector<double>;

class GaussianProcess {
 public:
  // `noise`: observation noise variance relative to the (standardized) signal variance of 1.
  explicit GaussianProcess(double noise) : noise_(noise) {}

  // Fits to samples (x in [0,1]^d). The length scale is the one of a small grid that maximizes
  // the marginal likelihood, so smooth and rough objectives both fit.
  void fit(const std::vector<Point>& x, const std::vector<double>& y);
  // Posterior mean and variance of the objective at x, in the units of y.
  struct Prediction {
    double mean;
    double variance;
  };
  Prediction predict(const Point& x) const;
  double length_scale() const { return length_scale_; }

 private:
  double kernel(const Point& a, const Point& b) const;
  // Factorizes K + noise*I for the current length scale; returns the log marginal likelihood.
  double factorize();

  double noise_;
  double length_scale_ = 0.3;
  std::vector<Point> x_;
  std::vector<double> y_;  // standardized
  double y_mean_ = 0, y_scale_ = 1;
  std::vector<double> chol_;  // lower triangle, row-major n x n
  std::vector<double> alpha_;  // (K + noise I)^-1 y
};

// Expected improvement over `best` of a normal N(mean, variance), with exploration margin xi.
double expected_improvement(double mean, double variance, double best, double xi);

class BayesianOptimizer {
 public:
  // `initial`: how many space-filling points come before the surrogate is trusted.
  BayesianOptimizer(int dimensions, double noise, uint64_t seed, int initial = 3);

  void add_sample(const Point& x, double y);
  // The next point to sample: space-filling first, then the maximum of expected improvement.
  Point next();
  // The sampled point with the highest posterior mean (robust to one lucky noisy sample), and
  // that mean.
  Point best() const;
  size_t samples() const { return x_.size(); }

 private:
  Point random_point();

  int dimensions_;
  int initial_;
  GaussianProcess gp_;
  std::mt19937_64 rng_;
  std::vector<Point> x_;
  std::vector<double> y_;
};

}  // namespace krug::observe
