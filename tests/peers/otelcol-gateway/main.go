// Program otelcol-gateway is the first tier of the scale-out section of the
// README: it routes whole traces to the second tier with the loadbalancing
// exporter. It is a separate build because the module proxy serves that
// exporter, with all of its dependencies, only up to contrib v0.148.0, and
// every collector module of one build stays at one release.
package main

import (
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/loadbalancingexporter"
	"github.com/open-telemetry/opentelemetry-collector-contrib/extension/storage/filestorage"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/processor"
	"go.opentelemetry.io/collector/processor/batchprocessor"
	"go.opentelemetry.io/collector/processor/memorylimiterprocessor"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func components() (otelcol.Factories, error) {
	var err error
	factories := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	// file_storage keeps the sending queue on disk, so a crash loses no acknowledged span.
	if factories.Extensions, err = otelcol.MakeFactoryMap(filestorage.NewFactory()); err != nil {
		return factories, err
	}
	if factories.Receivers, err = otelcol.MakeFactoryMap(otlpreceiver.NewFactory()); err != nil {
		return factories, err
	}
	if factories.Processors, err = otelcol.MakeFactoryMap[processor.Factory](
		memorylimiterprocessor.NewFactory(),
		batchprocessor.NewFactory(),
	); err != nil {
		return factories, err
	}
	factories.Exporters, err = otelcol.MakeFactoryMap(loadbalancingexporter.NewFactory())
	return factories, err
}

func main() {
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol-gateway",
			Description: "OpenTelemetry Collector gateway tier for run-otel's tests",
			Version:     "0.148.0-run-otel",
		},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					envprovider.NewFactory(),
					fileprovider.NewFactory(),
					// --set and yaml: overrides, as the tests point the shipped config at their ports.
					yamlprovider.NewFactory(),
				},
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatal(err)
	}
}
