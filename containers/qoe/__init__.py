"""The QoE manager (DQoES): holds each container to its client's latency target by moving CPU limits.

Modules follow the paper's: ``algorithm`` (Algorithm 1, classes G/S/B and the allocation
policies it is compared with), ``listener`` (Algorithm 2, when to run it), ``monitors``
(Application Monitor and Worker Monitor), ``executor`` (applies limits through a backend),
``analyst`` (QoE Analyst: targets, performance table, reports) and ``manager`` (the loop).

Speaks to containers only through ``containers.backends.base.ContainerBackend``.
"""
