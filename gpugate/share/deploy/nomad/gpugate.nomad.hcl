# gpugate on Nomad: one gate on every client that has the NVIDIA container runtime, in front
# of that client's runtimes (docs/scale-out.md).
#
# Each client needs, in its agent configuration:
#
#     client {
#       host_volume "gpugate-state" {        # the SQLite store; chown 10001:10001 it once
#         path      = "/var/lib/gpugate"
#         read_only = false
#       }
#     }
#     plugin "docker" {
#       config {
#         allowed_modes { pid = ["host"] }   # pid_mode = "host" is refused without it
#         # allow_runtimes defaults to ["runc", "nvidia"]
#       }
#     }
#
# Every token lives in a Nomad variable, which this job's task may read (nothing of a token
# is in the job spec, which whoever may read the job can read):
#
#     nomad var put nomad/jobs/gpugate control_token="$(openssl rand -hex 32)" \
#         batch_token="$(openssl rand -hex 32)" read_token="$(openssl rand -hex 32)"
#     nomad job run -var image=registry.example/gpugate:0.1.0 gpugate/share/deploy/nomad/gpugate.nomad.hcl
#
# With Vault instead, each token template reads a secret (docs/scale-out.md, "Nomad").

variable "image" {
  type        = string
  description = "The gate's image, built from gpugate/share/deploy/Containerfile."
  default     = "registry.example/gpugate:0.1.0"
}

job "gpugate" {
  # One allocation on every eligible client, placed again when a client joins.
  type        = "system"
  datacenters = ["*"]

  # Clients whose Docker has the NVIDIA runtime (the docker driver fingerprints its runtimes).
  constraint {
    attribute = "${attr.driver.docker.runtimes}"
    operator  = "set_contains"
    value     = "nvidia"
  }

  update {
    max_parallel = 1
    stagger      = "30s"
  }

  group "gate" {
    # The gate takes the runtimes' own ports of the client; static ports make Nomad refuse
    # any other allocation that wants them.
    network {
      mode = "host"
      port "ollama" {
        static = 11434
      }
      port "comfyui" {
        static = 8188
      }
      port "whisper" {
        static = 8080
      }
      port "vllm" {
        static = 8000
      }
      port "control" {
        static = 9411
      }
    }

    volume "state" {
      type      = "host"
      source    = "gpugate-state"
      read_only = false
    }

    # One service per runtime port, registered with the client's address: a client of this
    # node's Ollama asks for gpugate-ollama on its own node.
    service {
      provider = "nomad"
      name     = "gpugate-ollama"
      port     = "ollama"
      check {
        type     = "tcp"
        interval = "10s"
        timeout  = "2s"
      }
    }

    service {
      provider = "nomad"
      name     = "gpugate-comfyui"
      port     = "comfyui"
      check {
        type     = "tcp"
        interval = "10s"
        timeout  = "2s"
      }
    }

    service {
      provider = "nomad"
      name     = "gpugate-whisper"
      port     = "whisper"
      check {
        type     = "tcp"
        interval = "10s"
        timeout  = "2s"
      }
    }

    service {
      provider = "nomad"
      name     = "gpugate-vllm"
      port     = "vllm"
      check {
        type     = "tcp"
        interval = "10s"
        timeout  = "2s"
      }
    }

    # The control port: /metrics for Prometheus (nomad_sd_configs, service gpugate-control).
    # A TCP check: Nomad's own checks are HTTP or TCP, and an HTTP check's header is part of
    # the job, where no token belongs (reads off loopback need the read token). Where
    # Consul registers the services, a script check can run the readiness probe in the task
    # with /secrets/read.token instead (docs/scale-out.md).
    service {
      provider = "nomad"
      name     = "gpugate-control"
      port     = "control"
      tags     = ["metrics"]
      check {
        type     = "tcp"
        interval = "10s"
        timeout  = "2s"
      }
    }

    task "gpugate" {
      driver = "docker"
      # The image's user; the template files below are given to it.
      user = "10001:10001"

      config {
        image = var.image
        # The runtimes' ports of the client, and their loopback upstreams.
        network_mode = "host"
        # NVML reports host PIDs; attribution reads every process's /proc entries.
        pid_mode = "host"
        # Mounts the driver's NVML library and the /dev/nvidia* nodes of
        # NVIDIA_VISIBLE_DEVICES. No `device "nvidia/gpu"` block: the device plugin would
        # give the gate one GPU for itself, away from the runtimes it fronts, and the gate
        # must see every card of the client.
        runtime         = "nvidia"
        readonly_rootfs = true
        cap_drop        = ["all"]
        security_opt    = ["no-new-privileges"]
        # The host's video group (44 on Debian and Ubuntu), for /dev/nvidia* that are 0660
        # root:video rather than the driver's default 0666.
        group_add  = ["44"]
        entrypoint = ["gpugate"]
        args       = ["serve", "--config", "/local/consumers.yaml"]
        mount {
          type     = "tmpfs"
          target   = "/tmp"
          readonly = false
          tmpfs_options {
            size = 16777216
          }
        }
      }

      env {
        # Every card, for NVML only: `utility` mounts libnvidia-ml and nvidia-smi, no CUDA.
        NVIDIA_VISIBLE_DEVICES     = "all"
        NVIDIA_DRIVER_CAPABILITIES = "utility"
        GPUGATE_LOG_LEVEL          = "INFO"
      }

      volume_mount {
        volume      = "state"
        destination = "/var/lib/gpugate"
      }

      # consumers.yaml (docs/configuration.md). A changed file is re-read on SIGHUP.
      template {
        destination   = "local/consumers.yaml"
        change_mode   = "signal"
        change_signal = "SIGHUP"
        data          = <<-EOF
          budget:
            reserve: 1GiB
            reserve_max: 2GiB
            sample_interval: 500ms
            stale_after: 5s
            reclaim_timeout: 5s

          gate:
            # Off loopback for Prometheus and the health check; reads need the read scope.
            control: 0.0.0.0:9411
            control_public: false
            database: /var/lib/gpugate/gpugate.db
            # Below kill_timeout (30s, the most a client allows by default).
            shutdown_grace: 25s
            control_tokens:
              - file:/secrets/control.token
              - token: file:/secrets/read.token
                scopes: [read]

          # Each runtime listens on the client's loopback; processes are matched by
          # command line.
          consumers:
            ollama:
              runtime: ollama
              listen: 0.0.0.0:11434
              upstream: http://127.0.0.1:11435
              class: interactive
              residency: {policy: keep_warm, ttl: 15m}
              processes: {commands: ["ollama serve"]}
            comfyui:
              runtime: comfyui
              listen: 0.0.0.0:8188
              upstream: http://127.0.0.1:8189
              envelope: 12GiB
              working_set: 1GiB
              residency: {policy: load_on_demand}
              processes: {commands: ["main.py --listen 127.0.0.1 --port 8189"]}
            whisper:
              runtime: whisper
              listen: 0.0.0.0:8080
              upstream: http://127.0.0.1:8081
              envelope: 2050MiB
              residency: {policy: always_warm}
              processes: {commands: ["whisper-server"]}
            vllm:
              runtime: vllm
              listen: 0.0.0.0:8000
              upstream: http://127.0.0.1:8001
              envelope: 13GiB
              sleep_level: 1
              class: background
              processes: {commands: ["vllm serve"]}

          identities:
            - name: batch
              class: background
              tokens: ["file:/secrets/batch.token"]
        EOF
      }

      # Tokens, rendered into the task's secrets directory (in memory) for the gate's user
      # only. A rotated token is picked up on SIGHUP, without a restart.
      template {
        destination   = "secrets/control.token"
        uid           = 10001
        gid           = 10001
        perms         = "0400"
        change_mode   = "signal"
        change_signal = "SIGHUP"
        data          = "{{ with nomadVar \"nomad/jobs/gpugate\" }}{{ .control_token }}{{ end }}\n"
      }

      template {
        destination   = "secrets/batch.token"
        uid           = 10001
        gid           = 10001
        perms         = "0400"
        change_mode   = "signal"
        change_signal = "SIGHUP"
        data          = "{{ with nomadVar \"nomad/jobs/gpugate\" }}{{ .batch_token }}{{ end }}\n"
      }

      template {
        destination   = "secrets/read.token"
        uid           = 10001
        gid           = 10001
        perms         = "0400"
        change_mode   = "signal"
        change_signal = "SIGHUP"
        data          = "{{ with nomadVar \"nomad/jobs/gpugate\" }}{{ .read_token }}{{ end }}\n"
      }

      # SIGTERM, then gate.shutdown_grace for the streams in flight, then the kill.
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      resources {
        cpu    = 500
        memory = 1024
      }
    }
  }
}
