# Setpoint's two commands are `make demo` and `make test`; each installs and
# starts what it needs (a local Kubernetes control plane built from the
# official Go modules, RabbitMQ from Debian's packages) and reuses what is
# already there.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

K8S_VERSION := $(shell awk '{for (i = 1; i < NF; i++) if ($$i == "k8s.io/kubernetes" && $$(i + 1) ~ /^v/) {print $$(i + 1); exit}}' tests/controlplane/go.mod)
SETPOINT_CACHE ?= $(HOME)/.cache/setpoint
export SETPOINT_CACHE K8S_VERSION
KUBECTL := $(SETPOINT_CACHE)/k8s-$(K8S_VERSION)/bin/kubectl
HELM_VERSION := $(shell awk '$$1 == "helm.sh/helm/v4" {print $$2; exit}' tests/tools/helm/go.mod)
HELM := $(SETPOINT_CACHE)/helm-$(HELM_VERSION)/bin/helm
# The OCI registry the chart-source tests push charts to (CNCF distribution).
REGISTRY_VERSION := $(shell awk '$$1 == "github.com/distribution/distribution/v3" {print $$2; exit}' tests/tools/registry/go.mod)
export SETPOINT_REGISTRY ?= $(SETPOINT_CACHE)/registry-$(REGISTRY_VERSION)/bin/registry
# The renderers Setpoint runs (kustomize through kubectl, and helm), built
# from their Go modules into the cache.
export SETPOINT_KUBECTL ?= $(KUBECTL)
export SETPOINT_HELM ?= $(HELM)
export KUBECONFIG := $(CURDIR)/.cluster/kubeconfig
export CARGO_TERM_COLOR ?= never
# Cargo builds are cached outside the checkout, keyed by the toolchain, so a
# fresh clone (CI) reuses the compiled dependencies.
RUSTC_VERSION := $(shell rustc --version 2>/dev/null | awk '{print $$2}')
export CARGO_TARGET_DIR ?= $(SETPOINT_CACHE)/cargo-target-$(RUSTC_VERSION)

PHONY_EXTRA := crd bench bench-large image image-deps image-context image-lock image-renderers image-sizes test-image check-fresh-image
.PHONY: all build test test-multicluster clusters-up clusters-down test-restart test-ui test-ha screenshot browser-deps signature-deps rabbitmq-cluster-up rabbitmq-cluster-down unit lint demo bench cluster-build cluster-up cluster-down \
	rabbitmq-up rabbitmq-down up down fmt helm-build registry-build $(PHONY_EXTRA)

all: build

build:
	cargo build --release

fmt:
	cargo fmt --all

## The CRD YAML, generated from the Rust types (a test checks the copies).
crd:
	cargo run --quiet -- crd > config/crd/applications.setpoint.dev.yaml
	cargo run --quiet -- crd --applicationset > config/crd/applicationsets.setpoint.dev.yaml
	cargo run --quiet -- crd --receiver > config/crd/receivers.setpoint.dev.yaml
	cargo run --quiet -- crd --provider > config/crd/providers.setpoint.dev.yaml
	cargo run --quiet -- crd --alert > config/crd/alerts.setpoint.dev.yaml
	cp config/crd/applications.setpoint.dev.yaml config/crd/applicationsets.setpoint.dev.yaml config/crd/receivers.setpoint.dev.yaml config/crd/providers.setpoint.dev.yaml config/crd/alerts.setpoint.dev.yaml charts/setpoint/crds/

## The local control plane (see tests/controlplane/cluster.sh).
cluster-build:
	tests/controlplane/cluster.sh build

cluster-up:
	tests/controlplane/cluster.sh up

cluster-down:
	tests/controlplane/cluster.sh down

## Two more control planes, staging and prod (.cluster-staging,
## .cluster-prod), for the many-clusters tests; the same binaries.
REMOTE_CLUSTERS := staging prod

clusters-up: cluster-build
	@for c in $(REMOTE_CLUSTERS); do CLUSTER_DIR=$(CURDIR)/.cluster-$$c tests/controlplane/cluster.sh up; done

clusters-down:
	@for c in $(REMOTE_CLUSTERS); do CLUSTER_DIR=$(CURDIR)/.cluster-$$c tests/controlplane/cluster.sh down; done

## helm, built from its Go module (see tests/tools/helm/build.sh).
helm-build:
	tests/tools/helm/build.sh >/dev/null

## The OCI registry, built from its Go module (see tests/tools/registry/build.sh).
registry-build:
	tests/tools/registry/build.sh >/dev/null

## RabbitMQ on 127.0.0.1:5672 (see tests/broker/rabbitmq.sh).
rabbitmq-up:
	tests/broker/rabbitmq.sh up

rabbitmq-down:
	tests/broker/rabbitmq.sh down

## A 3-node RabbitMQ cluster on 127.0.0.1:5681-5683 beside the broker
## above, for `make test-ha` (see tests/broker/rabbitmq.sh).
rabbitmq-cluster-up:
	tests/broker/rabbitmq.sh cluster-up

rabbitmq-cluster-down:
	tests/broker/rabbitmq.sh cluster-down

up: cluster-up rabbitmq-up helm-build registry-build
down: cluster-down rabbitmq-down

# Tests and benchmarks run in this RabbitMQ vhost, emptied before each run
# so that the queues they leave never pile up.
FRESH_TEST_VHOST := tests/broker/rabbitmq.sh fresh-vhost setpoint-test

lint:
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

## Everything: format, lints, unit and integration tests against the real
## control plane and RabbitMQ. The benchmarks are compiled (clippy
## --all-targets) but run only by `make bench`, in release mode.
## gpg and ssh-keygen: Setpoint verifies signed commits with them, and
## the signature tests make their keys with them (tests/signatures.rs).
SIGNATURE_DEPS := gnupg openssh-client

signature-deps:
	@dpkg-query -W -f '$${Status}\n' $(SIGNATURE_DEPS) 2>/dev/null | grep -c '^install ok installed$$' | grep -qx $(words $(SIGNATURE_DEPS)) || { \
	  echo "[test] installing $(SIGNATURE_DEPS) from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $(SIGNATURE_DEPS) >/dev/null; }

test: up lint signature-deps
	@echo "[test] cargo test against $$(grep server: $(KUBECONFIG) | awk '{print $$2}') and amqp://127.0.0.1:5672"
	$(FRESH_TEST_VHOST)
	cargo test --lib --bins --tests

## Many clusters (tests/multicluster.rs): Applications on the local control
## plane deploying to staging and prod; it stops prod's API server for 30 s.
test-multicluster: up clusters-up
	cargo test --test multicluster

## The API server restarted five times under a running Setpoint
## (tests/apiserver_restart.rs). Alone, after `make test`: it disrupts every
## client of this control plane (the repo's .cluster) while it runs.
test-restart: up
	cargo test --test apiserver_restart

## The dashboard in a real headless Chromium (tests/ui_browser.rs), driven
## over WebDriver by chromedriver; both from Debian, installed when missing.
BROWSER_DEPS := chromium chromium-driver

browser-deps:
	@dpkg-query -W -f '$${Status}\n' $(BROWSER_DEPS) 2>/dev/null | grep -c '^install ok installed$$' | grep -qx $(words $(BROWSER_DEPS)) || { \
	  echo "[test-ui] installing $(BROWSER_DEPS) from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $(BROWSER_DEPS) >/dev/null; }

test-ui: up browser-deps
	cargo test --test ui_browser

## The README's screenshot (docs/dashboard.png), taken by the browser test.
screenshot: up browser-deps
	SETPOINT_SCREENSHOT=$(CURDIR)/docs/dashboard.png cargo test --test ui_browser

## The RabbitMQ cluster losing a node under a burst of webhooks
## (tests/broker_cluster.rs), with quorum queues: it stops and starts the
## cluster's nodes, not the shared broker.
test-ha: up rabbitmq-cluster-up
	cargo test --test broker_cluster

## The container image (Containerfile; image/build.sh): an OCI archive under
## $(CARGO_TARGET_DIR)/image with its SPDX SBOM, built with buildah from
## Debian packages (image/packages.txt, pinned in image/debian.lock), the
## release binary, and helm and kustomize in one binary at the versions the
## tests use (image/renderers). The last line is "<archive> <digest>". No
## Docker engine, no registry.
IMAGE_SOURCE ?= $(shell git remote get-url origin 2>/dev/null | grep -E '^(https://|git@)' || echo unknown)
RENDERERS := $(SETPOINT_CACHE)/renderers-helm-$(HELM_VERSION)-kustomize-$(shell awk '$$1 == "sigs.k8s.io/kustomize/kustomize/v5" {print $$2; exit}' image/renderers/go.mod)/bin/helm
IMAGE_ENV := IMAGE_RENDERERS=$(RENDERERS) IMAGE_SOURCE=$(IMAGE_SOURCE)

# buildah and mmdebstrap build; podman and runc run the smoke test's
# read-only root filesystem case.
IMAGE_DEPS := buildah mmdebstrap binutils podman runc

image-deps:
	@dpkg-query -W -f '$${Status}\n' $(IMAGE_DEPS) 2>/dev/null | grep -c '^install ok installed$$' | grep -qx $(words $(IMAGE_DEPS)) || { \
	  echo "[image] installing $(IMAGE_DEPS) from Debian"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $(IMAGE_DEPS) >/dev/null; }

## helm and kustomize in one binary, from their Go modules (image/renderers/build.sh).
image-renderers:
	image/renderers/build.sh >/dev/null

image: image-deps build image-renderers
	$(IMAGE_ENV) image/build.sh build

## The Containerfile's build context, for Docker or Podman; prints its directory.
image-context: image-deps
	@$(MAKE) --no-print-directory build image-renderers >&2
	@$(IMAGE_ENV) image/build.sh context

## What each part of the image unpacks to (the README's table).
image-sizes: image-deps build image-renderers
	@$(IMAGE_ENV) image/build.sh sizes

## `make image` as the first command of a fresh clone (image/fresh.sh): a
## clone of this checkout with empty Cargo, Go-module and Setpoint caches.
check-fresh-image: image-deps
	image/fresh.sh

## Resolve the image's Debian packages anew (a new debian.lock to commit).
image-lock: image-deps
	image/rootfs.sh lock

## The image's smoke test (image/smoke.sh): versions, and one reconcile from
## inside the image as UID 65532 against the local control plane.
test-image: up image-deps build image-renderers
	$(IMAGE_ENV) image/smoke.sh

## Benchmarks against the real control plane and RabbitMQ (release build).
bench: up clusters-up
	command -v wrk >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
	$(FRESH_TEST_VHOST)
	cargo bench --bench reconcile
	cargo bench --bench pipeline
	cargo bench --bench floor
	cargo bench --bench routing
	cargo bench --bench depends
	cargo bench --bench ui
	cargo bench --bench charts
	cargo bench --bench preview
	cargo bench --bench multicluster
	cargo bench --bench appset
	cargo bench --bench notify
	cargo bench --bench compat
	cargo bench --bench rollback

## The fleet benchmark at 10,000 Applications of Flux's MTTP shape
## (ServiceAccount, Service, Deployment of 0 replicas, Ingress), in one
## repository and in 100: first sync, one commit changing all, a no-op sweep;
## time, CPU, API and Git requests per phase, peak RSS. Needs the /16
## service range of tests/controlplane/cluster.sh (a cluster started before
## it holds only 254 Services: `make down up`). About 40 minutes.
bench-large: up
	$(FRESH_TEST_VHOST)
	SETPOINT_BENCH_ONLY=fleet SETPOINT_BENCH_SHAPE=mttp SETPOINT_BENCH_FLEETS=$${SETPOINT_BENCH_FLEETS:-10000} \
	  SETPOINT_BENCH_REPOS=$${SETPOINT_BENCH_REPOS:-1,100} cargo bench --bench pipeline

demo: up
	cargo build --bin setpoint
	KUBECTL=$(KUBECTL) SETPOINT=$(CARGO_TARGET_DIR)/debug/setpoint tests/demo/demo.sh
